"""Roofline predictions: each layer's seconds per dtype from its counts and a `HardwareProfile`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from .._core.data import input_part
from .._core.dtypes import COMPUTE_DTYPES, FLOAT32, canonical_dtype
from ..hardware import SLOW, UNSUPPORTED, HardwareProfile, resolve_hardware
from ..layers import model_fingerprint
from .counting import ITEMSIZE, LayerCost, count_costs
from .table import CostTable, LayerCostRecord
from .timers import framework_versions
from .trace import trace_model

#: Fraction of peak FLOP/s a matmul/conv reaches in the roofline prediction.
MATMUL_EFFICIENCY = 0.6
#: Fraction of float32 peak that vector (elementwise) arithmetic reaches.
VECTOR_EFFICIENCY = 0.25


def predicted_layer_seconds(
    cost: LayerCost, hardware: HardwareProfile, dtype: str, batch_size: int
) -> float | None:
    """Returns roofline forward+backward seconds of one layer in `dtype` (`None`: infeasible).

    `max(compute time, memory time) + kernels x op overhead`, where matmul FLOPs
    run at the dtype's peak (float32 peak when 16-bit dimensions are not
    multiples of `hardware.alignment`), vector FLOPs at the float32 vector rate,
    and a dtype without native kernels is multiplied by `hardware.slow_penalty`.

    Args:
        cost: the layer's `LayerCost`.
        hardware: the device profile.
        dtype: compute dtype.
        batch_size: samples per step.

    Returns:
        Seconds, or `None` where the device cannot run `dtype`.

    Example:

    ```python
    cost = autoprec.cost.count_costs(model)["dense"]
    autoprec.cost.predicted_layer_seconds(cost, autoprec.hardware.get("rtx4090"), "float16", 64)
    ```
    """
    support = hardware.support(dtype)
    if support == UNSUPPORTED:
        return None
    if cost.is_free:
        return 0.0
    aligned = all(dim % max(hardware.alignment, 1) == 0 for dim in cost.matmul_dims)
    matmul_rate = hardware.peak_flops(dtype if aligned else FLOAT32) * MATMUL_EFFICIENCY
    vector_rate = hardware.float32_flops * VECTOR_EFFICIENCY
    matmul_flops = (cost.matmul_flops + cost.backward_matmul_flops) * batch_size
    vector_flops = (cost.vector_flops + cost.backward_vector_flops) * batch_size
    compute_seconds = matmul_flops / matmul_rate + vector_flops / vector_rate
    memory_seconds = cost.bytes_moved(dtype, batch_size) / hardware.memory_bandwidth
    work_seconds = max(compute_seconds, memory_seconds)
    if support == SLOW:
        work_seconds *= hardware.slow_penalty
    return work_seconds + max(cost.kernels, 1) * hardware.op_overhead_seconds


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
) -> LayerCostRecord:
    """Returns one layer's `LayerCostRecord`: `seconds` and the counts behind them at `batch_size`.

    Args:
        cost: the layer's counts.
        seconds: `{dtype: seconds or None}`.
        batch_size: samples per step the FLOPs and bytes are for.
        dtypes: the dtypes whose bytes moved are recorded.
        source: where the seconds come from (`"predicted"`, `"measured"`, ...).

    Returns:
        The record.

    Example:

    ```python
    cost = autoprec.cost.count_costs(model)["dense"]
    roofline_record(cost, {"float32": 1e-4}, 32, ["float32"], "measured").forward_flops
    ```
    """
    return LayerCostRecord(
        path=cost.path,
        class_name=cost.class_name,
        seconds=seconds,
        forward_flops=cost.forward_flops * batch_size,
        backward_flops=cost.backward_flops * batch_size,
        bytes_moved={dtype: cost.bytes_moved(dtype, batch_size) for dtype in dtypes},
        saved_elements_per_sample=cost.saved_elements,
        weight_elements=cost.weight_elements,
        source=source,
        note=cost.note,
    )


def predict_costs(
    model: keras.Model,
    hardware: HardwareProfile | str = "local",
    *,
    batch_size: int = 32,
    x: Any = None,
    dtypes: Sequence[str] = COMPUTE_DTYPES,
) -> CostTable:
    """Predicts every layer's forward+backward seconds per dtype with a roofline model.

    Args:
        model: a built Keras model.
        hardware: `"local"` (this device, detected), a profile name such as
            `"rtx4090"` or a `HardwareProfile`.
        batch_size: samples per training step.
        x: a batch, inputs alone or `(x, y)`, whose shapes are traced: an array,
            a list, a dict or any nesting of them. Needed for subclassed models
            and for inputs with a dynamic dimension (a sequence length), which
            then take the batch's.
        dtypes: dtypes to predict.

    Returns:
        A `CostTable` with `source="predicted"`.

    Example:

    ```python
    table = autoprec.cost.predict_costs(model, "rtx2080ti", batch_size=64)
    table.seconds("dense", "bfloat16")  # slower than float16: no bf16 tensor cores
    ```
    """
    profile = resolve_hardware(hardware)
    trace = trace_model(model, None if x is None else input_part(x))
    counts = count_costs(model, trace)
    dtypes = [canonical_dtype(dtype) for dtype in dtypes]
    layers = {
        path: roofline_record(
            cost,
            {dtype: predicted_layer_seconds(cost, profile, dtype, batch_size) for dtype in dtypes},
            batch_size,
            dtypes,
            "predicted",
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
