"""What each layer costs in each dtype: FLOP/byte counts, roofline predictions and measurements."""

from .boundaries import (
    MIN_RELATIVE_ERROR,
    MixedPlan,
    fit_boundary_cost,
    mixed_assignment,
    mixed_plans,
)
from .cache import default_cache_dir
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
from .measure import calibrate
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
    measure_train_step,
    measure_train_steps,
    time_train_steps,
)
from .table import DEFAULT_RELATIVE_ERROR, CostTable, LayerCostRecord

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
    "measure_train_step",
    "measure_train_steps",
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
