"""Applying a precision plan inside `fit`: policies, loss scaling, the guard, saving, TensorBoard."""

from .apply import PlanHandle, apply_plan, reset_compiled_functions
from .guard import Guard, NonFiniteTrainingError
from .loss_scale import FlooredLossScaleOptimizer, LossScale, current_loss_scale
from .saving import attached_plan, load_model, load_plan_from_archive, save_model
from .training import PlanCallback

__all__ = [
    "FlooredLossScaleOptimizer",
    "Guard",
    "LossScale",
    "NonFiniteTrainingError",
    "PlanCallback",
    "PlanHandle",
    "apply_plan",
    "attached_plan",
    "current_loss_scale",
    "load_model",
    "load_plan_from_archive",
    "reset_compiled_functions",
    "save_model",
]
