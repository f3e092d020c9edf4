"""`search()`: the cheapest dtype per layer under an accuracy budget, with an Optuna study."""

from .budget import Budget
from .driver import search, search_in_processes
from .evaluator import (
    LOW_FIDELITY_STEPS,
    Evaluator,
    FidelityCheck,
    ProxyResult,
    check_reference,
    clone_for_search,
    confirmation_reasons,
    longer_batches,
    trivial_baseline,
)
from .floor import CLASSIFICATION_LOSS_WORDS, has_classification_loss, rounding_floor_outputs
from .heuristic import heuristic_plan
from .record import TrialRecord
from .result import ParetoPoint, SearchResult
from .settings import SearchSettings, StudyCallback
from .space import (
    SENSITIVE_CLASS_PATTERNS,
    Group,
    allowed_dtypes,
    compute_layers,
    float8_unsafe_layers,
    float16_unsafe_layers,
    group_layers,
    is_sensitive,
    make_groups,
    matches_any,
    output_layers,
    run_profiler,
)
from .storage import resolve_storage
from .timing import measure_step_rounds, measure_step_seconds
from .warm_start import Neighbour, explorer, neighbours

__all__ = [
    "CLASSIFICATION_LOSS_WORDS",
    "SearchSettings",
    "StudyCallback",
    "LOW_FIDELITY_STEPS",
    "SENSITIVE_CLASS_PATTERNS",
    "Budget",
    "Evaluator",
    "FidelityCheck",
    "Group",
    "Neighbour",
    "ParetoPoint",
    "ProxyResult",
    "SearchResult",
    "TrialRecord",
    "allowed_dtypes",
    "check_reference",
    "clone_for_search",
    "compute_layers",
    "confirmation_reasons",
    "explorer",
    "float8_unsafe_layers",
    "float16_unsafe_layers",
    "group_layers",
    "has_classification_loss",
    "heuristic_plan",
    "is_sensitive",
    "longer_batches",
    "make_groups",
    "matches_any",
    "measure_step_rounds",
    "measure_step_seconds",
    "neighbours",
    "output_layers",
    "resolve_storage",
    "rounding_floor_outputs",
    "run_profiler",
    "search",
    "search_in_processes",
    "trivial_baseline",
]
