"""A plan's predicted training step time, speedup over float32 and memory, from a `CostTable`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import keras

from .._core.dtypes import (
    FLOAT8,
    FLOAT32,
    canonical_dtype,
    canonical_float8_source,
    float8_eligible,
)
from .._core.models import inner_optimizer
from ..errors import HardwareError, PlanError
from ..hardware import HardwareProfile
from ..layers import LayerInfo, describe_model
from .prediction import FLOAT8_ITEMSIZE, ITEMSIZE, predict_costs, weight_count
from .table import DEFAULT_RELATIVE_ERROR, CostTable

#: Fraction of device memory a step may fill (the rest: framework, workspaces).
USABLE_MEMORY_FRACTION = 0.9


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Predicted step time, speedup and memory of a model under a plan (see docs/api.md)."""

    step_seconds: float
    float32_step_seconds: float
    speedup: float
    batch_size: int
    layer_seconds: dict[str, float]
    cast_seconds: float
    overhead_seconds: float
    activation_bytes_per_sample: float
    parameter_bytes: float
    optimizer_bytes: float
    memory_bytes: int | None
    infeasible_layers: tuple[str, ...]
    device: str
    source: str
    boundary_seconds: float = 0.0
    relative_error: float = DEFAULT_RELATIVE_ERROR

    @property
    def fixed_memory_bytes(self) -> float:
        """Memory that does not grow with the batch: weights, gradients, optimizer state."""
        return self.parameter_bytes + self.optimizer_bytes

    @property
    def training_memory_bytes(self) -> float:
        """Estimated memory of one training step at `batch_size`."""
        return self.fixed_memory_bytes + self.activation_bytes_per_sample * self.batch_size

    def max_batch_size(self, memory_bytes: int | None = None) -> int:
        """Returns the largest batch whose step fits in `USABLE_MEMORY_FRACTION` of `memory_bytes`
        (default the device's); 0 when not even one sample fits."""
        memory = memory_bytes if memory_bytes is not None else self.memory_bytes
        if memory is None:
            raise HardwareError("memory size unknown: pass memory_bytes to max_batch_size().")
        usable = memory * USABLE_MEMORY_FRACTION - self.fixed_memory_bytes
        if usable <= 0 or self.activation_bytes_per_sample <= 0:
            return 0
        return int(usable // self.activation_bytes_per_sample)


def _plan_mapping(plan: Any) -> dict[str, str]:
    if isinstance(plan, str):
        return {"*": canonical_dtype(plan, "plan")}
    layers = getattr(plan, "layers", plan)
    if not isinstance(layers, Mapping):
        raise PlanError(
            f"expected a PrecisionPlan, a {{path: dtype}} dict or a dtype name, "
            f"got {type(plan).__name__}."
        )
    return {str(path): canonical_dtype(dtype, f"plan[{path!r}]") for path, dtype in layers.items()}


@dataclasses.dataclass(frozen=True)
class _PlanDtypes:
    """What each layer of a plan computes in, for its own time and for the tensors it passes."""

    plan: Mapping[str, str]
    infos: Mapping[str, LayerInfo]
    class_names: Mapping[str, str]
    float8_source: str
    resolved: dict[str, str] = dataclasses.field(default_factory=dict)

    def resolve(self, path: str | None, depth: int = 0) -> str:
        """The plan's dtype of `path`, or the followed layer's, descendant's, parent's."""
        if path is None:
            return FLOAT32
        if "*" in self.plan:
            return self.plan["*"]
        if path not in self.resolved:
            result = self.plan.get(path)
            info = self.infos.get(path)
            if result is None and info is not None and info.follows and depth < 50:
                result = self.resolve(info.follows, depth + 1)
            if result is None:
                result = next(
                    (dtype for other, dtype in self.plan.items() if other.startswith(path + "/")),
                    None,
                )
            parent = path
            while result is None and "/" in parent:
                parent = parent.rsplit("/", 1)[0]
                result = self.plan.get(parent)
            self.resolved[path] = result or FLOAT32
        return self.resolved[path]

    def layer(self, path: str | None) -> str:
        dtype = self.resolve(path)
        if dtype == FLOAT8 and not float8_eligible(self.class_names.get(path or "")):
            return self.float8_source
        return dtype

    def activation(self, path: str | None) -> str:
        dtype = self.layer(path)
        return self.float8_source if dtype == FLOAT8 else dtype


def _optimizer_slots(model: keras.Model) -> int:
    optimizer = inner_optimizer(getattr(model, "optimizer", None))
    if optimizer is None:
        return 2
    name = type(optimizer).__name__
    if name == "SGD":
        return 1 if getattr(optimizer, "momentum", 0) else 0
    return {"Adam": 2, "AdamW": 2, "Adamax": 2, "Nadam": 2, "RMSprop": 1, "Adagrad": 1}.get(name, 2)


def _step_seconds(
    table: CostTable, dtypes: _PlanDtypes, batch_size: int
) -> tuple[float, dict[str, float], float, float]:
    """Returns `(total, {path: seconds}, cast seconds, boundary seconds)` of one plan's step."""
    layer_seconds = {
        path: table.seconds(path, dtypes.layer(path), batch_size) for path in table.layers
    }
    cast_seconds = boundary_seconds = 0.0
    for producer, consumer, elements in table.edges:
        source_dtype, target_dtype = dtypes.activation(producer), dtypes.activation(consumer)
        if source_dtype != target_dtype:
            cast_dtype = target_dtype if target_dtype != FLOAT32 else source_dtype
            cast_seconds += table.cast_cost(elements * batch_size, cast_dtype)
            if producer is not None:
                boundary_seconds += table.boundary_cost(elements * batch_size, cast_dtype)
    total = (
        sum(layer_seconds.values()) + cast_seconds + boundary_seconds + table.step_overhead_seconds
    )
    return total, layer_seconds, cast_seconds, boundary_seconds


def _memory_bytes(
    model: keras.Model, table: CostTable, dtypes: _PlanDtypes
) -> tuple[float, float, float]:
    """Returns `(activation bytes per sample, parameter bytes, optimizer bytes)` under a plan."""
    activation_bytes = sum(
        record.saved_elements_per_sample * ITEMSIZE[dtypes.activation(path)]
        for path, record in table.layers.items()
    )
    activation_bytes += sum(
        elements * 4 for producer, _, elements in table.edges if producer is None
    )
    parameters = weight_count(model.weights)
    trainable = weight_count(model.trainable_weights)
    half_copies = sum(
        record.weight_elements * ITEMSIZE[dtypes.activation(path)]
        + (record.weight_elements * FLOAT8_ITEMSIZE if dtypes.layer(path) == FLOAT8 else 0)
        for path, record in table.layers.items()
        if dtypes.activation(path) != FLOAT32
    )
    return (
        float(activation_bytes),
        float(parameters * 4 + trainable * 4 + half_copies),
        float(trainable * 4 * _optimizer_slots(model)),
    )


def estimate(
    model: keras.Model,
    plan: Any,
    hardware: HardwareProfile | str = "local",
    *,
    costs: CostTable | None = None,
    batch_size: int | None = None,
    x: Any = None,
) -> Estimate:
    """Estimates a plan's training step time, speedup over float32 and memory.

    Args:
        model: the built Keras model the plan is for.
        plan: a `PrecisionPlan`, a `{path: dtype}` dict, or one dtype name for a uniform plan;
            layers it does not name follow their producer, descendant or parent, else float32.
        hardware: the device costs are predicted for without `costs`: `"local"`, a profile name
            such as `"rtx4090"` or a `HardwareProfile`.
        costs: a `CostTable` (from `calibrate` or `predict_costs`) to estimate with.
        batch_size: samples per step; default the table's (32 for a prediction).
        x: a batch whose shapes the prediction traces (subclassed models, dynamic dimensions).

    Returns:
        An `Estimate`.

    Example:

    ```python
    est = autoprec.estimate(model, {"dense": "bfloat16"}, "rtx4090", batch_size=64)
    print(est.speedup, est.max_batch_size())
    autoprec.estimate(model, autoprec.PrecisionPlan.uniform(model, "float8"), "rtx4090")
    ```
    """
    mapping = _plan_mapping(plan)
    # The dtype of a plan's float8 layers' non-matmul work (bfloat16 by default).
    float8_source = canonical_float8_source(getattr(plan, "float8_source", None))
    if isinstance(hardware, CostTable):
        raise PlanError(
            "estimate: pass a cost table as costs=table; hardware= names a device "
            "('local', 'rtx4090' or a HardwareProfile)."
        )
    if costs is not None and not isinstance(costs, CostTable):
        raise PlanError(
            f"estimate: costs must be an autoprec.CostTable, got {type(costs).__name__}."
        )
    table = costs or predict_costs(
        model, hardware, batch_size=batch_size or 32, x=x, float8_source=float8_source
    )
    batch = int(batch_size or table.batch_size)
    infos = describe_model(model)
    class_names = {path: info.class_name for path, info in infos.items()}
    class_names.update({path: record.class_name for path, record in table.layers.items()})
    dtypes = _PlanDtypes(mapping, infos, class_names, float8_source)
    step, layer_seconds, cast_seconds, boundary_seconds = _step_seconds(table, dtypes, batch)
    float32 = _PlanDtypes({"*": FLOAT32}, infos, class_names, float8_source)
    float32_step = _step_seconds(table, float32, batch)[0]

    activation_bytes, parameter_bytes, optimizer_bytes = _memory_bytes(model, table, dtypes)
    return Estimate(
        step_seconds=step,
        float32_step_seconds=float32_step,
        speedup=0.0 if math.isinf(step) or step <= 0 else float32_step / step,
        batch_size=batch,
        layer_seconds=layer_seconds,
        cast_seconds=cast_seconds,
        overhead_seconds=table.step_overhead_seconds,
        activation_bytes_per_sample=activation_bytes,
        parameter_bytes=parameter_bytes,
        optimizer_bytes=optimizer_bytes,
        memory_bytes=table.memory_bytes,
        infeasible_layers=tuple(p for p, value in layer_seconds.items() if math.isinf(value)),
        device=table.device,
        source=table.source,
        boundary_seconds=boundary_seconds,
        relative_error=float(table.relative_error),
    )
