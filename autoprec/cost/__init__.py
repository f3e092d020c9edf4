"""What each layer costs in each dtype: FLOP/byte counts, roofline predictions and measurements."""

from .boundaries import (
    MIN_RELATIVE_ERROR,
    MixedPlan,
    fit_boundary_cost,
    mixed_assignment,
    mixed_plans,
)
from .cache import default_cache_dir
from .counting import count_costs
from .estimate import USABLE_MEMORY_FRACTION, Estimate, PlanLayers, estimate
from .formulas import ACTIVATION_FLOPS
from .layer_cost import LayerCost
from .measure import calibrate
from .roofline import MATMUL_EFFICIENCY, VECTOR_EFFICIENCY, predict_costs, predicted_layer_seconds
from .steps import (
    MEASURING_BACKENDS,
    clone_with_policies,
    clone_with_uniform_policy,
    measure_train_step,
    measure_train_steps,
    time_train_steps,
)
from .synthetic import synthetic_arguments, synthetic_tensor
from .table import DEFAULT_RELATIVE_ERROR, CostTable, LayerCostRecord
from .trace import (
    TRACES,
    ArgumentValue,
    Edge,
    LayerCall,
    MappingArgument,
    ModelTrace,
    TensorSpec,
    batch_signature,
    random_inputs,
    sample_inputs,
    spec_of,
    trace_model,
)

__all__ = [
    "ACTIVATION_FLOPS",
    "DEFAULT_RELATIVE_ERROR",
    "MATMUL_EFFICIENCY",
    "MEASURING_BACKENDS",
    "MIN_RELATIVE_ERROR",
    "USABLE_MEMORY_FRACTION",
    "VECTOR_EFFICIENCY",
    "ArgumentValue",
    "CostTable",
    "Edge",
    "Estimate",
    "LayerCall",
    "LayerCost",
    "LayerCostRecord",
    "MappingArgument",
    "MixedPlan",
    "ModelTrace",
    "PlanLayers",
    "TensorSpec",
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
    "TRACES",
    "batch_signature",
    "synthetic_arguments",
    "synthetic_tensor",
    "time_train_steps",
    "trace_model",
]
