"""`search()`: the cheapest dtype per layer under an accuracy budget, with an Optuna study."""

# Re-exported for `autoprec.search.<name>` and the top-level package.
from .budget import Budget, has_classification_loss, rounding_floor_outputs  # noqa: F401
from .context import SearchSettings  # noqa: F401
from .driver import search, search_in_processes  # noqa: F401
from .evaluator import (  # noqa: F401
    Evaluator,
    ProxyResult,
    clone_for_search,
    measure_step_rounds,
    measure_step_seconds,
)
from .heuristic import heuristic_plan  # noqa: F401
from .result import ParetoPoint, SearchResult, TrialRecord  # noqa: F401
from .space import (  # noqa: F401
    allowed_dtypes,
    compute_layers,
    float8_unsafe_layers,
    float16_unsafe_layers,
    group_layers,
    output_layers,
)
from .study import resolve_storage  # noqa: F401
