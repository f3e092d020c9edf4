"""autoprec: per-layer automatic mixed precision for Keras 3.

Gives every layer of a Keras model the cheapest floating-point precision
(float16, bfloat16 or float32) that still trains to the accuracy you ask for.

Example:

```python
import autoprec

plan = autoprec.PrecisionPlan.uniform(model, "bfloat16").with_dtype("head", "float32")
model.fit(x, y, callbacks=[autoprec.AutoPrecision(plan)])
```
"""

from . import hardware, layers
from ._version import __version__
from .callback import AutoPrecision
from .cost import CostTable, Estimate, calibrate, estimate, predict_costs
from .errors import (
    AutoprecError,
    BackendError,
    HardwareError,
    PlanError,
    ProfileError,
)
from .plan import PlanDiff, PlanRule, PrecisionPlan
from .profiler import LayerProfile, Profile, ProfileCallback, TensorStats, profile
from .runtime import (
    FlooredLossScaleOptimizer,
    NonFiniteTrainingError,
    PlanHandle,
    apply_plan,
    load_model,
    save_model,
)
from .search import Budget, SearchResult, SearchSettings, heuristic_plan, search

__all__ = [
    "__version__",
    "AutoPrecision",
    "AutoprecError",
    "BackendError",
    "Budget",
    "CostTable",
    "Estimate",
    "FlooredLossScaleOptimizer",
    "HardwareError",
    "LayerProfile",
    "NonFiniteTrainingError",
    "PlanDiff",
    "PlanError",
    "PlanHandle",
    "PlanRule",
    "PrecisionPlan",
    "Profile",
    "ProfileCallback",
    "ProfileError",
    "SearchResult",
    "SearchSettings",
    "TensorStats",
    "apply_plan",
    "calibrate",
    "estimate",
    "hardware",
    "heuristic_plan",
    "layers",
    "load_model",
    "predict_costs",
    "profile",
    "save_model",
    "search",
]
