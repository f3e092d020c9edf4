"""Calibration: every layer's forward+backward seconds per dtype measured on this device.

`calibrate` times each computing layer alone (`timers`), casts between float32
and each 16-bit dtype, and whole training steps of uniform-policy copies of the
model (`measure_train_steps`); what the summed layers miss of a whole step becomes
a shared per-step overhead and a per-dtype scale of layer times. Every
measurement is cached (`cache`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np

from .._core.data import batch_size_of, flat_arrays, input_part, slice_batch, target_part
from .._core.dtypes import COMPUTE_DTYPES, FLOAT32, POLICY_FOR_DTYPE, canonical_dtype
from .._core.models import fresh_optimizer
from .._core.timing import time_interleaved
from ..errors import PlanError
from ..hardware import FAST, HardwareProfile, resolve_hardware
from ..layers import layer_paths, model_fingerprint
from .cache import MeasurementCache, default_cache_dir, layer_signature, model_signature
from .counting import LayerCost, count_costs
from .roofline import predicted_layer_seconds, roofline_record
from .table import CostTable, LayerCostRecord
from .timers import (
    _SLOW_ROUNDS,
    _SLOW_SECONDS,
    _framework_versions,
    _time_cast,
    _time_empty_function,
    _time_layer,
    _timing_backend,
)
from .trace import LayerCall, trace_model


def _measure_casts(
    dtypes: Sequence[str], cache: MeasurementCache, repeats: int, dispatch_seconds: float
) -> dict[str, dict[str, float]]:
    """Fits `fixed + per_element x n` for one cast between float32 and each 16-bit dtype."""
    small, large = 1024, 1 << 21
    result = {}
    for dtype in dtypes:
        if dtype == FLOAT32:
            continue
        timings = []
        for elements in (small, large):
            key = cache.key({"cast": dtype, "elements": elements})
            seconds = cache.get(key)
            if seconds is None:
                seconds = _time_cast(dtype, elements, repeats)
                cache.put(key, seconds, f"cast float32<->{dtype}, {elements} elements")
            timings.append(seconds)
        per_element = max((timings[1] - timings[0]) / (large - small), 0.0)
        fixed = max(timings[0] - per_element * small - dispatch_seconds / 2.0, 0.0)
        result[dtype] = {"fixed": fixed, "per_element": per_element}
    return result


def clone_with_uniform_policy(model: keras.Model, dtype: str) -> keras.Model:
    """Returns a copy of `model` (fresh weights, same architecture) with every layer in `dtype`.

    Each layer gets the `mixed_*` policy of `dtype` (`"float32"` for float32);
    layers that refuse a policy keep theirs. `model` is left as it is. The copy
    of a compiled model is compiled from its compile config (as
    `keras.models.clone_model` does, with an optimizer of its own); compile it
    again to train it another way (float16 wants a `LossScaleOptimizer`).

    Args:
        model: a Functional or Sequential model (`keras.models.clone_model`
            cannot copy a subclassed one).
        dtype: the compute dtype of every layer (any alias `canonical_dtype` accepts).

    Returns:
        The copy.

    Example:

    ```python
    copy = autoprec.cost.clone_with_uniform_policy(model, "bfloat16")
    copy.layers[-1].dtype_policy.name  # "mixed_bfloat16"
    ```
    """
    policy = POLICY_FOR_DTYPE[canonical_dtype(dtype, "clone_with_uniform_policy")]
    clone = keras.models.clone_model(model)
    for layer in layer_paths(clone).values():
        try:
            layer.dtype_policy = policy
        except Exception:  # noqa: BLE001 - a layer that refuses a policy keeps its own
            pass
    return clone


def _step_function(model: keras.Model, batch: Any, dtype: str, jit_compile: bool):
    """Returns a zero-argument function running one training step of a uniform-`dtype` copy."""
    inputs = input_part(batch)
    targets = target_part(batch)
    clone = clone_with_uniform_policy(model, dtype)
    loss = getattr(model, "loss", None) if targets is not None else None
    if targets is None or loss is None:
        outputs = clone(slice_batch(inputs, 1))
        batch_size = batch_size_of(inputs, error_class=PlanError)
        targets = keras.tree.map_structure(
            lambda t: (
                np.random.default_rng(0)
                .standard_normal((batch_size, *t.shape[1:]))
                .astype("float32")
            ),
            outputs,
        )
        loss = "mse"
    optimizer = fresh_optimizer(getattr(model, "optimizer", None))
    if dtype == "float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    clone.compile(optimizer=optimizer, loss=loss, jit_compile=jit_compile)
    # On JAX the batch goes to the device once, as a prefetching input pipeline would.
    inputs, targets = _timing_backend("measure_train_steps()").to_device((inputs, targets))
    return lambda: clone.train_on_batch(inputs, targets)


def measure_train_steps(
    model: keras.Model,
    batch: Any,
    dtypes: Sequence[str] = (FLOAT32,),
    repeats: int = 5,
    jit_compile: bool = False,
    warmup: int = 2,
) -> dict[str, float]:
    """Times whole training steps of copies of `model` under uniform policies, interleaved.

    Each copy (fresh weights, same architecture, every layer under the dtype's
    `mixed_*` policy) is compiled with the model's optimizer class (Adam if
    none; float16 wrapped in `LossScaleOptimizer`) and loss (mean squared error
    on random targets when the batch has no targets or the model is not
    compiled), so the user's model, its weights and optimizer state are
    untouched. The copies are timed in alternating rounds, so that their ratios
    hold on a loaded machine. Works on the TensorFlow and JAX backends (Keras'
    own `train_on_batch`; on JAX the batch is placed on the device once).

    Args:
        model: a Functional or Sequential model.
        batch: `x` or `(x, y)`.
        dtypes: uniform compute dtypes, one copy each.
        repeats: timed rounds (median), after the warm-up steps; a copy whose
            last warm-up step takes over half a second is timed twice, alone,
            after the others.
        jit_compile: whether to compile the steps with XLA.
        warmup: steps of each copy before the timed ones (the first traces its
            step; the last, timed apart, tells whether the copy is slow).

    Returns:
        `{dtype: median seconds of one train_on_batch step}`.

    Raises:
        BackendError: on a Keras backend other than TensorFlow or JAX.

    Example:

    ```python
    steps = autoprec.cost.measure_train_steps(model, (x[:32], y[:32]), ["float32", "bfloat16"])
    steps["bfloat16"] / steps["float32"]
    ```
    """
    _timing_backend("measure_train_steps()")
    names = [canonical_dtype(dtype) for dtype in dtypes]
    functions = {dtype: _step_function(model, batch, dtype, jit_compile) for dtype in names}
    timings = time_interleaved(
        functions,
        rounds=repeats,
        warmup=warmup,
        slow_seconds=_SLOW_SECONDS,
        slow_rounds=_SLOW_ROUNDS,
    )
    return {dtype: timing.median for dtype, timing in timings.items()}


def measure_train_step(
    model: keras.Model,
    batch: Any,
    dtype: str = FLOAT32,
    repeats: int = 5,
    jit_compile: bool = False,
    warmup: int = 2,
) -> float:
    """Times one whole training step of a copy of `model` under a uniform policy.

    One dtype of `measure_train_steps`; see there for how the copy is made.

    Args:
        model: a Functional or Sequential model.
        batch: `x` or `(x, y)`.
        dtype: uniform compute dtype of the copy.
        repeats: timed steps (median), after the warm-up steps; 2 when the
            last warm-up step takes over half a second.
        jit_compile: whether to compile the step with XLA.
        warmup: steps before the timed ones (the first traces the step function;
            the last tells whether the step is slow).

    Returns:
        Median seconds of one `train_on_batch` step.

    Example:

    ```python
    seconds = autoprec.cost.measure_train_step(model, (x[:32], y[:32]), "bfloat16")
    ```
    """
    dtype = canonical_dtype(dtype)
    return measure_train_steps(model, batch, [dtype], repeats, jit_compile, warmup)[dtype]


def _measurable(cost: LayerCost) -> bool:
    return not cost.is_free and "counted in" not in cost.note


def calibrate(
    model: keras.Model,
    x: Any,
    *,
    dtypes: Sequence[str] = COMPUTE_DTYPES,
    hardware: HardwareProfile | str = "local",
    repeats: int = 5,
    measure_model_step: bool | str | Sequence[str] = True,
    cache_dir: str | os.PathLike | None = None,
    use_cache: bool = True,
    verbose: int = 1,
) -> CostTable:
    """Measures every layer's forward+backward time in each dtype on this device.

    Runs on Keras' TensorFlow backend (`tf.function`, XLA when the model is
    compiled with `jit_compile=True`) and on its JAX backend (`jax.jit`, on
    JAX's default device: a GPU when JAX has one; TensorFlow is not needed).
    Each computing layer is rebuilt alone from its config with the dtype's
    policy, built on the input shapes it sees in the model (with the batch's
    size), and its compiled forward+backward on random inputs is timed (two
    warm-up calls, median of `repeats`). Layers that cannot be rebuilt get the
    roofline prediction, flagged in `source`. Casts between float32 and each
    16-bit dtype are timed too, and with `measure_model_step` whole training
    steps of copies of the model under uniform policies, in alternating rounds
    (`measure_train_steps`): float32 and each 16-bit dtype of `dtypes`. A dtype
    `hardware` marks slow (float16 on a CPU under TensorFlow) is timed alone
    after two warm-up steps (twice when a step takes over half a second): its
    layers can run slower inside the whole step than alone (ResNet50 in float16
    on a CPU: 1.4x; float16 kernels there slow down on values in float16's
    subnormal range, which real gradients reach and random timing inputs do
    not), so its per-layer sum alone would predict it badly. Leave it out of
    `dtypes` to skip it. The part
    of the residual (measured step minus summed layers and casts) common to all
    measured dtypes becomes `step_overhead_seconds`; the rest becomes a per-dtype
    `layer_time_scale_by_dtype`, so that `estimate` of each measured uniform plan
    equals its measured step and mixed plans weigh each dtype's correction by
    the layer time spent in it. Measurements are cached per device, framework
    versions and layer signature (class, config, input shapes, batch), whole
    steps per model signature, input shapes and dtype, so a second call
    measures nothing.

    Args:
        model: a built Keras model.
        x: one training batch, inputs alone or an `(x, y)` tuple; its size is the
            batch size timed.
        dtypes: compute dtypes to time.
        hardware: what this device is, for the predictions of layers that cannot be
            timed alone and for which dtypes run natively: `"local"` (detected), a
            hardware profile name or a `HardwareProfile`. The timings are always of
            this device.
        repeats: timed repetitions per measurement (median).
        measure_model_step: which whole training steps to time: `True` (or
            `"all"`) every dtype of `dtypes`, a slow one alone after two warm-up
            steps; a list of dtypes (from `dtypes`); `"fast"` only those
            `hardware` runs natively; `False` none.
        cache_dir: cache folder; default `$AUTOPREC_CACHE_DIR` or `~/.cache/autoprec`.
        use_cache: read and write the cache.
        verbose: 0 silent, 1 (default) a `keras.utils.Progbar` over the layers timed.

    Returns:
        A `CostTable` with `source="measured"`; `stats` counts `"timed"`,
        `"cached"` and `"fallback"` layer measurements, and `"model_step"`
        whole steps (`"model_steps_timed"` of them timed now).

    Raises:
        PlanError: if `measure_model_step` names a dtype not in `dtypes`.
        BackendError: on a Keras backend other than TensorFlow or JAX (torch).

    Example:

    ```python
    x, y = data
    costs = autoprec.calibrate(model, (x[:32], y[:32]), verbose=0)
    print(costs.summary())
    ```
    """
    _timing_backend("calibrate()")
    dtypes = [canonical_dtype(dtype) for dtype in dtypes]
    if FLOAT32 not in dtypes:
        dtypes = [FLOAT32, *dtypes]
    profile = resolve_hardware(hardware)
    batch = x
    inputs = input_part(batch)
    batch_size = batch_size_of(inputs, error_class=PlanError)
    trace = trace_model(model, inputs)
    counts = count_costs(model, trace)
    paths = layer_paths(model)
    versions = _framework_versions()
    device = (
        f"{profile.display_name} ({os.cpu_count()} cpus)"
        if profile.kind == "cpu"
        else (profile.display_name)
    )
    directory = (
        (Path(cache_dir) if cache_dir is not None else default_cache_dir()) if (use_cache) else None
    )
    cache = MeasurementCache(directory, device, versions)
    jit_compile = bool(getattr(model, "jit_compile", False) is True)
    stats = {"timed": 0, "cached": 0, "fallback": 0}
    # Whole steps are timed first, in a process not yet crowded by per-layer functions.
    measured_steps = _measure_whole_steps(
        model,
        batch,
        _whole_step_dtypes(measure_model_step, dtypes, profile),
        profile,
        _StepTiming(cache, repeats, jit_compile, stats),
    )

    dispatch_key = cache.key({"dispatch": True})
    dispatch_seconds = cache.get(dispatch_key)
    if dispatch_seconds is None:
        dispatch_seconds = _time_empty_function(repeats)
        cache.put(dispatch_key, dispatch_seconds, "empty compiled call")

    work = [path for path, cost in counts.items() if _measurable(cost)]
    bar = (
        keras.utils.Progbar(len(work) * len(dtypes), unit_name="timing")
        if (verbose and work)
        else None
    )
    timing = _LayerTiming(
        dtypes, batch_size, repeats, cache, stats, profile, jit_compile, dispatch_seconds, bar
    )
    layers: dict[str, LayerCostRecord] = {}
    for path, cost in counts.items():
        if path not in work:
            layers[path] = roofline_record(
                cost, dict.fromkeys(dtypes, 0.0), batch_size, dtypes, "measured"
            )
            continue
        seconds, source = _measure_layer(paths[path], trace.calls[path], cost, timing)
        layers[path] = roofline_record(cost, seconds, batch_size, dtypes, source)

    _subtract_children(layers, counts)
    table = CostTable(
        device=device,
        source="measured",
        batch_size=batch_size,
        layers=layers,
        edges=[(edge.producer, edge.consumer, edge.elements_per_sample) for edge in trace.edges],
        cast_seconds=_measure_casts(dtypes, cache, repeats, dispatch_seconds),
        layer_fixed_seconds=0.0,
        memory_bytes=profile.memory_bytes,
        model_fingerprint=model_fingerprint(model),
        versions=versions,
        stats=stats,
    )
    _attribute_step_overhead(table, measured_steps)
    return table


@dataclasses.dataclass(frozen=True)
class _LayerTiming:
    """How `calibrate` times each layer: dtypes, batch, cache, counters, fallback profile."""

    dtypes: Sequence[str]
    batch_size: int
    repeats: int
    cache: MeasurementCache
    stats: dict[str, int]
    profile: HardwareProfile
    jit_compile: bool
    dispatch_seconds: float
    bar: keras.utils.Progbar | None


def _measure_layer(
    layer: keras.layers.Layer, calls: Sequence[LayerCall], cost: LayerCost, timing: _LayerTiming
) -> tuple[dict[str, float | None], str]:
    """Measures (or reads from cache, or predicts as a fallback) one layer in each dtype."""
    seconds: dict[str, float | None] = {}
    sources = set()
    for dtype in timing.dtypes:
        total = 0.0
        for call in calls:
            key = timing.cache.key(
                {"layer": layer_signature(layer, call, timing.batch_size), "dtype": dtype}
            )
            value = timing.cache.get(key)
            if value is not None:
                timing.stats["cached"] += 1
                sources.add("cached")
            else:
                try:
                    value = _time_layer(
                        layer, call, dtype, timing.batch_size, timing.repeats, timing.jit_compile
                    )
                    value = max(value - timing.dispatch_seconds, 0.05 * value)
                    timing.cache.put(key, value, f"{call.class_name} {call.path} {dtype}")
                    timing.stats["timed"] += 1
                    sources.add("measured")
                except Exception as error:  # noqa: BLE001 - any failure falls back, flagged
                    predicted = predicted_layer_seconds(
                        cost, timing.profile, dtype, timing.batch_size
                    )
                    timing.stats["fallback"] += 1
                    sources.add(f"predicted (fallback: {type(error).__name__}: {error})"[:200])
                    if predicted is None:
                        total = math.inf
                        break
                    value = predicted / max(len(calls), 1)
            total += value
        seconds[dtype] = None if math.isinf(total) else total
        if timing.bar is not None:
            timing.bar.add(1)
    fallback = [source for source in sources if source.startswith("predicted")]
    if fallback:
        return seconds, fallback[0]
    return seconds, "measured" if "measured" in sources else "cached"


def _subtract_children(layers: dict[str, LayerCostRecord], counts: Mapping[str, LayerCost]) -> None:
    """Removes the children's time from containers timed whole (MultiHeadAttention).

    A standalone `MultiHeadAttention` runs its projections too; those are timed
    as its inner `EinsumDense` layers, so the container keeps only the rest.
    """
    for path, record in layers.items():
        prefix = path + "/"
        children = [other for other in layers if other.startswith(prefix)]
        if not children or not _measurable(counts[path]) or record.source.startswith("predicted"):
            continue
        for dtype, seconds in record.seconds.items():
            if seconds is None:
                continue
            inner = sum(layers[child].seconds.get(dtype) or 0.0 for child in children)
            record.seconds[dtype] = max(seconds - inner, 0.1 * seconds)


def _whole_step_dtypes(
    requested: bool | str | Sequence[str],
    dtypes: Sequence[str],
    profile: HardwareProfile,
) -> list[str]:
    """Returns the dtypes whose uniform whole step `calibrate` times, float32 first."""
    if requested is False or requested is None:
        return []
    keyword = requested.strip().lower() if isinstance(requested, str) else None
    if requested is True or keyword == "all":
        return list(dtypes)
    if keyword == "fast":
        return [dtype for dtype in dtypes if profile.support(dtype) == FAST]
    names = [requested] if isinstance(requested, str) else list(requested)
    chosen = {canonical_dtype(name, "measure_model_step") for name in names}
    missing = sorted(chosen - set(dtypes))
    if missing:
        raise PlanError(
            f"measure_model_step names {', '.join(missing)}, which calibrate() does not time "
            f"per layer (dtypes={list(dtypes)}); add it to dtypes, or pass True, 'fast' or False."
        )
    return [dtype for dtype in dtypes if dtype in chosen]


@dataclasses.dataclass
class _StepTiming:
    """Where and how `calibrate` times whole steps: cache, repeats, XLA, counters."""

    cache: MeasurementCache
    repeats: int
    jit_compile: bool
    stats: dict[str, int]


def _measure_whole_steps(
    model: keras.Model,
    batch: Any,
    dtypes: Sequence[str],
    profile: HardwareProfile,
    timing: _StepTiming,
) -> dict[str, float]:
    """Returns `{dtype: measured whole-step seconds}`, cached; empty if the model cannot be copied.

    The dtypes the device runs fast are timed together, interleaved (all again
    when one is missing from the cache, so their ratios come from one run);
    each slow one alone after two warm-up steps (twice when a step takes over
    half a second).
    """
    timing.stats.update({"model_step": 0, "model_steps_timed": 0})
    keys = {dtype: _whole_step_key(model, batch, dtype, timing) for dtype in dtypes}
    measured = {dtype: timing.cache.get(key) for dtype, key in keys.items()}
    fast = [dtype for dtype in dtypes if profile.support(dtype) == FAST]
    # The second warm-up step, past tracing, tells whether a step is slow.
    groups = [fast] if any(measured[dtype] is None for dtype in fast) else []
    groups += [[dtype] for dtype in dtypes if dtype not in fast and measured[dtype] is None]
    repeats = max(timing.repeats, 3)
    for group in groups:
        try:
            timed = measure_train_steps(model, batch, group, repeats, timing.jit_compile, 2)
        except Exception:  # noqa: BLE001 - subclassed models cannot be cloned: no correction
            return {}
        for dtype, seconds in timed.items():
            timing.cache.put(keys[dtype], seconds, f"whole {dtype} train step")
            measured[dtype] = seconds
            timing.stats["model_steps_timed"] += 1
    result = {dtype: seconds for dtype, seconds in measured.items() if seconds is not None}
    timing.stats["model_step"] = len(result)
    return result


def _whole_step_key(model: keras.Model, batch: Any, dtype: str, timing: _StepTiming) -> str:
    """Returns the cache key of one uniform-`dtype` whole step of `model` on `batch`'s shapes."""
    shapes = [list(array.shape) for array in flat_arrays(batch)]
    return timing.cache.key(
        {
            "model_step": model_signature(model),
            "shapes": shapes,
            "jit": timing.jit_compile,
            "dtype": dtype,
        }
    )


#: Smallest per-dtype layer-time scale (guards against a step measured absurdly fast).
_MIN_TIME_SCALE = 0.05


def _uniform_step_parts(table: CostTable, dtype: str) -> tuple[float, float]:
    """Returns `(summed raw layer seconds, cast seconds)` of a uniform `dtype` plan.

    Casts are those `estimate` counts for a uniform plan: model inputs arrive
    in float32.
    """
    layers = 0.0
    for record in table.layers.values():
        seconds = record.seconds.get(dtype)
        if seconds is None:
            return math.inf, 0.0
        layers += seconds
    casts = 0.0
    if dtype != FLOAT32:
        casts = sum(
            table.cast_cost(elements * table.batch_size, dtype)
            for producer, _, elements in table.edges
            if producer is None
        )
    return layers, casts


def _attribute_step_overhead(table: CostTable, measured: Mapping[str, float]) -> None:
    """Makes each measured uniform step's estimate equal its measurement.

    The residual (measured step minus summed layers and casts) that every
    measured dtype shows becomes the shared `step_overhead_seconds` (optimizer,
    loss, framework); what remains of each dtype's step is spread over its layers
    as `layer_time_scale_by_dtype[dtype]`. With float32 alone this is the
    previous behaviour: overhead when the residual is positive, else a scale.
    """
    parts = {dtype: _uniform_step_parts(table, dtype) for dtype in measured}
    parts = {dtype: part for dtype, part in parts.items() if math.isfinite(part[0])}
    if not parts:
        return
    residuals = [measured[dtype] - layers - casts for dtype, (layers, casts) in parts.items()]
    overhead = max(0.0, min(residuals))
    scales = {
        dtype: (
            max((measured[dtype] - casts - overhead) / layers, _MIN_TIME_SCALE)
            if layers > 0
            else 1.0
        )
        for dtype, (layers, casts) in parts.items()
    }
    table.step_overhead_seconds = overhead
    table.layer_time_scale = scales.get(FLOAT32, 1.0)
    table.layer_time_scale_by_dtype = scales
    table.measured_step_seconds = measured.get(FLOAT32)
    table.measured_step_seconds_by_dtype = {dtype: float(measured[dtype]) for dtype in parts}
