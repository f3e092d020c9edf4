"""What each layer costs in each dtype: FLOP/byte counts, roofline predictions and measurements.

Three steps, each usable alone:

* `trace_model(model)` runs one small forward pass with temporary hooks on every
  layer's `call` and records the shapes each layer sees and which layer feeds
  which (`ModelTrace`);
* `count_costs(model)` turns those shapes into forward/backward FLOPs and bytes
  (`LayerCost`), and `predict_costs(model, hardware, batch_size=batch_size)` turns counts
  into seconds with a roofline model of a `HardwareProfile`;
* `calibrate(model, batch)` measures each layer's forward+backward time in each
  dtype on this device instead (cached; on the TensorFlow or JAX backend, JAX
  timing in `autoprec._backends.jax`), plus the cost of casts and whole-model
  steps under uniform policies (float32 and each 16-bit dtype the device runs
  fast): what the summed layers miss becomes a fixed per-step overhead shared by
  all dtypes and a per-dtype scale of layer times, so that a uniform plan's
  estimate equals its measured step; and two mixed plans' whole steps, whose
  difference from their prediction becomes a cost per dtype boundary (the
  alternating plan) and the table's own prediction error, `relative_error`
  (the half-and-half plan, held out of the fit).

Both give a `CostTable`; `estimate(model, plan, hardware, costs=table)` sums it for a
plan: step time, speedup over float32, memory and the largest batch that fits.

Modules, in the order they build on each other: `trace` (shapes, edges, sample
inputs and synthetic arguments), `counting` (`LayerCost`), `table`
(`CostTable`), `timers` (one layer, cast or empty call timed on the backend),
`roofline` (`predict_costs`), `cache`, `steps` (whole training steps and the
correction they give), `estimate`, `boundaries` (the mixed plans timed whole, the
boundary cost and the prediction error fitted from them), `measure` (`calibrate`).
"""

from .boundaries import (
    MIN_RELATIVE_ERROR,
    MixedPlan,
    fit_boundary_cost,
    mixed_assignment,
    mixed_plans,
)
from .cache import default_cache_dir
from .clones import clone_with_policies, clone_with_uniform_policy
from .counting import count_costs
from .estimate import USABLE_MEMORY_FRACTION, Estimate, PlanLayers, estimate
from .formulas import ACTIVATION_FLOPS
from .layer_cost import LayerCost
from .measure import calibrate
from .roofline import MATMUL_EFFICIENCY, VECTOR_EFFICIENCY, predict_costs, predicted_layer_seconds
from .steps import (
    measure_train_step,
    measure_train_steps,
    time_train_steps,
)
from .synthetic import synthetic_arguments, synthetic_tensor
from .table import DEFAULT_RELATIVE_ERROR, CostTable, LayerCostRecord
from .timers import MEASURING_BACKENDS
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
