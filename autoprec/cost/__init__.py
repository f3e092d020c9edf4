"""What each layer costs in each dtype: FLOP/byte counts, roofline predictions and measurements."""

import warnings as _warnings

from .estimate import USABLE_MEMORY_FRACTION, Estimate, estimate
from .layer_calls import (
    TRACES,
    Edge,
    LayerCall,
    MappingArgument,
    ModelTrace,
    TensorSpec,
    batch_signature,
    random_inputs,
    sample_inputs,
    spec_of,
    synthetic_arguments,
    synthetic_tensor,
    trace_model,
)
from .measure import (
    MIN_RELATIVE_ERROR,
    MixedPlan,
    calibrate,
    fit_boundary_cost,
    mixed_assignment,
    mixed_plans,
)
from .prediction import (
    MATMUL_EFFICIENCY,
    LayerCost,
    count_costs,
    predict_costs,
    predicted_layer_seconds,
)
from .steps import (
    clone_with_policies,
    clone_with_uniform_policy,
    time_train_steps,
)
from .table import DEFAULT_RELATIVE_ERROR, CostTable, LayerCostRecord, default_cache_dir

__all__ = [
    "DEFAULT_RELATIVE_ERROR",
    "MATMUL_EFFICIENCY",
    "MIN_RELATIVE_ERROR",
    "TRACES",
    "USABLE_MEMORY_FRACTION",
    "CostTable",
    "Edge",
    "Estimate",
    "LayerCall",
    "LayerCost",
    "LayerCostRecord",
    "MappingArgument",
    "MixedPlan",
    "ModelTrace",
    "TensorSpec",
    "batch_signature",
    "calibrate",
    "clone_with_policies",
    "clone_with_uniform_policy",
    "count_costs",
    "default_cache_dir",
    "estimate",
    "fit_boundary_cost",
    "mixed_assignment",
    "mixed_plans",
    "predict_costs",
    "predicted_layer_seconds",
    "random_inputs",
    "sample_inputs",
    "spec_of",
    "synthetic_arguments",
    "synthetic_tensor",
    "time_train_steps",
    "trace_model",
]


def __getattr__(name: str):
    """`measure_train_steps` and `measure_train_step` left in 0.5 for `time_train_steps`."""
    if name in ("measure_train_steps", "measure_train_step"):
        _warnings.warn(
            f"autoprec.cost.{name} is deprecated: use autoprec.cost.time_train_steps(model, "
            "batch, dtypes), whose values are Timings (read .median).",
            DeprecationWarning,
            stacklevel=2,
        )
        return time_train_steps
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
