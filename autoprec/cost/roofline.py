"""Roofline predictions: each layer's seconds per dtype from its counts and a `HardwareProfile`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from .._core.data import input_part
from .._core.dtypes import (
    BFLOAT16,
    COMPUTE_DTYPES,
    FLOAT8,
    FLOAT32,
    PLAN_DTYPES,
    canonical_dtype,
    canonical_float8_source,
)
from ..hardware import SLOW, UNSUPPORTED, HardwareProfile, resolve_hardware
from ..layers import model_fingerprint
from .counting import count_costs
from .layer_cost import FLOAT8_EXTRA_KERNELS, FLOAT8_QUANTIZE_FLOPS, ITEMSIZE, LayerCost
from .steps import framework_versions
from .table import CostTable, LayerCostRecord
from .trace import trace_model

#: Fraction of peak FLOP/s a matmul/conv reaches in the roofline prediction.
MATMUL_EFFICIENCY = 0.6
#: Fraction of float32 peak that vector (elementwise) arithmetic reaches.
VECTOR_EFFICIENCY = 0.25


def predicted_layer_seconds(
    cost: LayerCost,
    hardware: HardwareProfile,
    dtype: str,
    batch_size: int,
    float8_source: str = BFLOAT16,
) -> float | None:
    """Returns roofline forward+backward seconds of one layer in `dtype` (`None`: infeasible)."""
    if dtype == FLOAT8:
        return predicted_float8_seconds(cost, hardware, batch_size, float8_source)
    support = hardware.support(dtype)
    if support == UNSUPPORTED:
        return None
    if cost.is_free:
        return 0.0
    aligned = all(dim % max(hardware.alignment, 1) == 0 for dim in cost.matmul_dims)
    matmul_rate = hardware.peak_flops(dtype if aligned else FLOAT32) * MATMUL_EFFICIENCY
    return (
        _work_seconds(
            cost, hardware, matmul_rate, cost.bytes_moved(dtype, batch_size), batch_size, support
        )
        + max(cost.kernels, 1) * hardware.op_overhead_seconds
    )


def _work_seconds(
    cost: LayerCost,
    hardware: HardwareProfile,
    matmul_rate: float,
    bytes_moved: float,
    batch_size: int,
    support: str,
) -> float:
    """Returns `max(compute, memory)` seconds, times `slow_penalty` for a slow dtype."""
    vector_rate = hardware.float32_flops * VECTOR_EFFICIENCY
    matmul_flops = (cost.matmul_flops + cost.backward_matmul_flops) * batch_size
    vector_flops = (cost.vector_flops + cost.backward_vector_flops) * batch_size
    compute_seconds = matmul_flops / matmul_rate + vector_flops / vector_rate
    work_seconds = max(compute_seconds, bytes_moved / hardware.memory_bandwidth)
    if support == SLOW:
        work_seconds *= hardware.slow_penalty
    return work_seconds


def float8_matmul_rate(cost: LayerCost, hardware: HardwareProfile, float8_source: str) -> float:
    """Returns the FLOP/s a float8 layer's matrix products reach (roofline, before efficiency)."""
    if all(dim % max(hardware.float8_alignment, 1) == 0 for dim in cost.float8_dims):
        return hardware.peak_flops(FLOAT8)
    aligned = all(dim % max(hardware.alignment, 1) == 0 for dim in cost.matmul_dims)
    return hardware.peak_flops(float8_source if aligned else FLOAT32)


def float8_quantize_seconds(
    cost: LayerCost, hardware: HardwareProfile, batch_size: int, float8_source: str = BFLOAT16
) -> float:
    """Returns the seconds a float8 layer's scaling work adds to one step."""
    vector_rate = hardware.float32_flops * VECTOR_EFFICIENCY
    flops = cost.float8_quantized_values(batch_size) * FLOAT8_QUANTIZE_FLOPS
    bytes_moved = cost.float8_quantize_bytes(batch_size, float8_source)
    passes = max(flops / vector_rate, bytes_moved / hardware.memory_bandwidth)
    return passes + cost.float8_matmuls * FLOAT8_EXTRA_KERNELS * hardware.op_overhead_seconds


def predicted_float8_seconds(
    cost: LayerCost, hardware: HardwareProfile, batch_size: int, float8_source: str = BFLOAT16
) -> float | None:
    """Returns roofline forward+backward seconds of a float8 layer (`None`: no float8 here)."""
    source = canonical_float8_source(float8_source)
    support = hardware.support(source)
    if not (cost.has_float8_path and hardware.supports_float8) or support == UNSUPPORTED:
        return None
    matmul_rate = float8_matmul_rate(cost, hardware, source) * MATMUL_EFFICIENCY
    work = _work_seconds(
        cost, hardware, matmul_rate, cost.bytes_moved(source, batch_size), batch_size, support
    )
    launches = max(cost.kernels, 1) * hardware.op_overhead_seconds
    return work + launches + float8_quantize_seconds(cost, hardware, batch_size, source)


def _predicted_cast_seconds(hardware: HardwareProfile) -> dict[str, dict]:
    return {
        dtype: {
            "fixed": hardware.op_overhead_seconds,
            "per_element": (4 + ITEMSIZE[dtype]) / hardware.memory_bandwidth,
        }
        for dtype in COMPUTE_DTYPES
        if dtype != FLOAT32
    }


def roofline_record(
    cost: LayerCost,
    seconds: dict[str, float | None],
    batch_size: int,
    dtypes: Sequence[str],
    source: str,
    float8_source: str = BFLOAT16,
) -> LayerCostRecord:
    """Returns one layer's `LayerCostRecord`: `seconds` and the counts behind them at `batch_size`."""
    return LayerCostRecord(
        path=cost.path,
        class_name=cost.class_name,
        seconds=seconds,
        forward_flops=cost.forward_flops * batch_size,
        backward_flops=cost.backward_flops * batch_size,
        bytes_moved={
            dtype: cost.bytes_moved(dtype, batch_size, float8_source)
            for dtype in dtypes
            if dtype != FLOAT8 or dtype in seconds
        },
        saved_elements_per_sample=cost.saved_elements,
        weight_elements=cost.weight_elements,
        source=source,
        note=cost.note,
    )


def _predicted_seconds(
    cost: LayerCost,
    profile: HardwareProfile,
    dtypes: Sequence[str],
    batch_size: int,
    float8_source: str,
) -> dict[str, float | None]:
    """Returns `{dtype: seconds}` of one layer; float8 only where it has a prediction."""
    seconds = {
        dtype: predicted_layer_seconds(cost, profile, dtype, batch_size, float8_source)
        for dtype in dtypes
    }
    if seconds.get(FLOAT8, 0.0) is None:
        del seconds[FLOAT8]
    return seconds


def predict_costs(
    model: keras.Model,
    hardware: HardwareProfile | str = "local",
    *,
    batch_size: int = 32,
    x: Any = None,
    dtypes: Sequence[str] = PLAN_DTYPES,
) -> CostTable:
    """Predicts every layer's forward+backward seconds per dtype with a roofline model.

    With `"float8"` (there by default), the table gets a float8 entry for each `Dense` and
    `EinsumDense` layer, and only on a device with FP8 tensor cores
    (`predicted_float8_seconds`, their non-matmul work in bfloat16); other
    layers and devices have none.

    Args:
        model: a built Keras model.
        hardware: `"local"` (this device, detected), a profile name such as
            `"rtx4090"` or a `HardwareProfile`.
        batch_size: samples per training step.
        x: a batch, inputs alone or `(x, y)`, whose shapes are traced: an array,
            a list, a dict or any nesting of them. Needed for subclassed models
            and for inputs with a dynamic dimension (a sequence length), which
            then take the batch's.
        dtypes: dtypes to predict (by default all four; `"float8"`: see above).

    Returns:
        A `CostTable` with `source="predicted"`.

    Example:

    ```python
    table = autoprec.cost.predict_costs(model, "rtx2080ti", batch_size=64)
    table.seconds("dense", "bfloat16")  # slower than float16: no bf16 tensor cores
    table = autoprec.cost.predict_costs(model, "rtx4090", dtypes=["float32", "float8"])
    table.layer_seconds("dense", "float8")
    ```
    """
    return predict_plan_costs(model, hardware, batch_size=batch_size, x=x, dtypes=dtypes)


def predict_plan_costs(
    model: keras.Model,
    hardware: HardwareProfile | str = "local",
    *,
    batch_size: int = 32,
    x: Any = None,
    dtypes: Sequence[str] = COMPUTE_DTYPES,
    float8_source: str = BFLOAT16,
) -> CostTable:
    """Predicts costs as `predict_costs` does, float8 layers' non-matmul work in `float8_source`."""
    profile = resolve_hardware(hardware)
    trace = trace_model(model, None if x is None else input_part(x))
    counts = count_costs(model, trace)
    dtypes = [canonical_dtype(dtype) for dtype in dtypes]
    source = canonical_float8_source(float8_source)
    layers = {
        path: roofline_record(
            cost,
            _predicted_seconds(cost, profile, dtypes, batch_size, source),
            batch_size,
            dtypes,
            "predicted",
            source,
        )
        for path, cost in counts.items()
    }
    return CostTable(
        device=profile.display_name,
        source="predicted",
        batch_size=int(batch_size),
        layers=layers,
        edges=[(edge.producer, edge.consumer, edge.elements_per_sample) for edge in trace.edges],
        cast_seconds=_predicted_cast_seconds(profile),
        layer_fixed_seconds=profile.op_overhead_seconds,
        memory_bytes=profile.memory_bytes,
        model_fingerprint=model_fingerprint(model),
        versions=framework_versions(),
        stats={"predicted": len(layers)},
    )
