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

__version__ = "0.1.0"

from . import hardware, layers  # noqa: E402
from .apply import PlanHandle, apply_plan  # noqa: E402
from .callback import AutoPrecision  # noqa: E402
from .cost import CostTable, Estimate, calibrate, estimate, predict_costs  # noqa: E402
from .errors import (  # noqa: E402
    AutoprecError,
    BackendError,
    HardwareError,
    PlanError,
    ProfileError,
)
from .guard import NonFiniteTrainingError  # noqa: E402
from .loss_scale import FlooredLossScaleOptimizer  # noqa: E402
from .plan import PlanDiff, PlanRule, PrecisionPlan  # noqa: E402
from .profiler import LayerProfile, Profile, ProfileCallback, TensorStats, profile  # noqa: E402
from .saving import load_model, save_model  # noqa: E402
from .search import Budget, SearchResult, heuristic_plan, search  # noqa: E402

__all__ = [
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
