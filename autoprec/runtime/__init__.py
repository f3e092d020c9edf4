"""Applying a precision plan inside `fit`: policies, loss scaling, the guard, saving, TensorBoard."""

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
