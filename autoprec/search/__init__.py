"""`search()`: the cheapest dtype per layer under an accuracy budget, with an Optuna study."""

# Re-exported for `autoprec.search.<name>` and the top-level package.
from .budget import Budget  # noqa: F401
from .driver import search, search_in_processes  # noqa: F401
from .evaluator import Evaluator, ProxyResult, clone_for_search  # noqa: F401
from .floor import has_classification_loss, rounding_floor_outputs  # noqa: F401
from .heuristic import heuristic_plan  # noqa: F401
from .record import TrialRecord  # noqa: F401
from .result import ParetoPoint, SearchResult  # noqa: F401
from .settings import SearchSettings  # noqa: F401
from .space import (  # noqa: F401
    allowed_dtypes,
    compute_layers,
    float8_unsafe_layers,
    float16_unsafe_layers,
    group_layers,
    output_layers,
)
from .storage import resolve_storage  # noqa: F401
from .timing import measure_step_rounds, measure_step_seconds  # noqa: F401
