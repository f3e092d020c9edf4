"""`search()`: the cheapest dtype per layer under an accuracy budget, with an Optuna study.

Each trial proposes a plan (one dtype per layer or per group of layers) and runs it at
rising fidelity, cheapest first:

1. profile feasibility: float16 is never proposed for a layer whose ranges do not fit it,
   and dtypes that do not run fast on the target hardware are left out;
2. numerical proxy: loss and gradients on a few calibration batches, from the same
   weights, against float32; hopeless plans are pruned (`trial.report` + `TrialPruned`);
3. short training: S steps from the same checkpoint on the same batches, then the budget
   metric on validation data. Only plans that pass this level can be returned.

The objective is the step time of the plan from the cost model (measured on this device
for `hardware="local"`, predicted from a hardware profile otherwise), with activation
memory as a tie-break; the budget is an Optuna constraint (`trial.set_constraint`, read
by the seeded `TPESampler`).

Modules: `budget` (`Budget`), `space` (compute layers, groups, allowed dtypes, float16
feasibility), `heuristic` (`heuristic_plan`), `evaluator` (proxy and short training),
`study` (Optuna storage, study and trials), `driver` (`search()` and the measured
confirmation), `result` (`SearchResult`).
"""

from .budget import Budget
from .driver import measure_step_seconds, search
from .evaluator import Evaluator, ProxyResult, clone_for_search
from .heuristic import heuristic_plan
from .result import ParetoPoint, SearchResult
from .space import (
    SENSITIVE_CLASS_PATTERNS,
    Group,
    allowed_dtypes,
    compute_layers,
    float16_unsafe_layers,
    group_layers,
    is_sensitive,
    make_groups,
    matches_any,
    output_layers,
    run_profiler,
)
from .study import resolve_storage

__all__ = [
    "SENSITIVE_CLASS_PATTERNS",
    "Budget",
    "Evaluator",
    "Group",
    "ParetoPoint",
    "ProxyResult",
    "SearchResult",
    "allowed_dtypes",
    "clone_for_search",
    "compute_layers",
    "float16_unsafe_layers",
    "group_layers",
    "heuristic_plan",
    "is_sensitive",
    "make_groups",
    "matches_any",
    "measure_step_seconds",
    "output_layers",
    "resolve_storage",
    "run_profiler",
    "search",
]
