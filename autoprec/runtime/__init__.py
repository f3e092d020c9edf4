"""Applying a precision plan inside `fit`: policies, loss scaling, the guard, saving, TensorBoard.

- `apply`: `apply_plan` sets each layer's dtype policy, `PlanHandle.restore` undoes it.
- `loss_scale`: `LossScale` (the settings) and `FlooredLossScaleOptimizer`, dynamic loss scaling
  with a floor.
- `guard`: `Guard` (the settings), attribution of a failing step and the promotion targets.
- `decision`: `decide`, the guard's pure step decision (`StepOutcome` in, `GuardDecision` out).
- `watch`: `GuardWatch`, the guard's state between steps and its read of the telemetry.
- `telemetry`: the in-step amax records the guard reads.
- `applied`: what a model runs after a callback applied a plan (so a second fit retraces nothing).
- `kernels`: 16-bit layers without a kernel on this device, and their fallback.
- `saving`: `save_model` / `load_model` with the plan inside the `.keras` archive.
- `tensorboard`: per-epoch loss scale, dtype counts and events for TensorBoard.
- `training`: `PlanCallback`, the Keras callback that applies a plan inside `fit`.

Example:

```python
plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
model.fit(x, y, callbacks=[autoprec.runtime.PlanCallback(plan)])
```
"""

from .apply import PlanHandle, apply_plan, check_plan_fits, reset_compiled_functions
from .guard import ON_NAN_MODES, Guard, NonFiniteTrainingError, promotion_target
from .kernels import MissingKernel, fallback_plan, find_missing_kernels
from .loss_scale import FlooredLossScaleOptimizer, LossScale, current_loss_scale
from .saving import (
    PLAN_ENTRY,
    attach_plan,
    attached_plan,
    load_model,
    load_plan_from_archive,
    save_model,
)
from .tensorboard import TrainingLog, dtype_table, events_text, training_scalars
from .training import PlanCallback

__all__ = [
    "ON_NAN_MODES",
    "PLAN_ENTRY",
    "FlooredLossScaleOptimizer",
    "Guard",
    "LossScale",
    "MissingKernel",
    "NonFiniteTrainingError",
    "PlanCallback",
    "PlanHandle",
    "TrainingLog",
    "apply_plan",
    "attach_plan",
    "attached_plan",
    "check_plan_fits",
    "current_loss_scale",
    "dtype_table",
    "events_text",
    "fallback_plan",
    "find_missing_kernels",
    "load_model",
    "load_plan_from_archive",
    "promotion_target",
    "reset_compiled_functions",
    "save_model",
    "training_scalars",
]
