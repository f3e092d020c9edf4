"""`search()`: the cheapest dtype per layer under an accuracy budget, with an Optuna study."""

# Re-exported for `autoprec.search.<name>` and the top-level package.
from .budget import (  # noqa: F401
    Budget,  # noqa: F401
    has_classification_loss,
    rounding_floor_outputs,
)
from .context import SearchSettings  # noqa: F401
from .driver import search, search_in_processes  # noqa: F401
from .evaluator import (  # noqa: F401  # noqa: F401
    Evaluator,
    ProxyResult,
    clone_for_search,
    measure_step_rounds,
    measure_step_seconds,
)
from .heuristic import heuristic_plan  # noqa: F401
from .result import (  # noqa: F401
    ParetoPoint,
    SearchResult,
    TrialRecord,  # noqa: F401
)
from .space import (  # noqa: F401
    allowed_dtypes,
    compute_layers,
    float8_unsafe_layers,
    float16_unsafe_layers,
    group_layers,
    output_layers,
)
from .study import resolve_storage  # noqa: F401
