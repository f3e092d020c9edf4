"""Calibration: every layer's forward+backward seconds per dtype measured on this device."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import keras

from .._core.data import batch_size_of, input_part
from .._core.dtypes import COMPUTE_DTYPES, FLOAT8, FLOAT32, canonical_dtype
from ..errors import PlanError
from ..hardware import FAST, HardwareProfile, detect, resolve_hardware
from ..layers import layer_paths, model_fingerprint
from .boundaries import MixedPlan, fit_boundary_cost, mixed_plans
from .cache import MeasurementCache, default_cache_dir, layer_signature
from .counting import count_costs
from .layer_cost import LayerCost
from .roofline import predicted_layer_seconds, roofline_record
from .sampling import kind_scales, sample_kinds, scaled_seconds
from .steps import (
    attribute_step_overhead,
    framework_versions,
    measure_whole_steps,
    measuring_backend,
    time_cast,
    time_empty_function,
    time_layer,
    whole_step_dtypes,
)
from .table import CostTable, LayerCostRecord
from .trace import LayerCall, ModelTrace, trace_model

logger = logging.getLogger("autoprec")


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
                # At least 9 rounds: a 1024-value cast takes microseconds, and one round
                # disturbed by another process would set its fixed cost alone.
                seconds = time_cast(dtype, elements, max(repeats, 9))
                cache.put(key, seconds, f"cast float32<->{dtype}, {elements} elements")
            timings.append(seconds)
        per_element = max((timings[1] - timings[0]) / (large - small), 0.0)
        fixed = max(timings[0] - per_element * small - dispatch_seconds / 2.0, 0.0)
        result[dtype] = {"fixed": fixed, "per_element": per_element}
    return result


def _measurable(cost: LayerCost) -> bool:
    return not cost.is_free and "counted in" not in cost.note


def float8_timeable(profile: HardwareProfile) -> bool:
    """Returns whether `calibrate` may time float8 on this device described by `profile`."""
    if not profile.supports_float8:
        return False
    return profile.detected or detect().supports_float8


def _layer_dtypes(cost: LayerCost, dtypes: Sequence[str]) -> tuple[str, ...]:
    """Returns the dtypes one layer is timed in: float8 only for a layer with a float8 path."""
    return tuple(dtype for dtype in dtypes if dtype != FLOAT8 or cost.has_float8_path)


@dataclasses.dataclass(frozen=True)
class _Setting:
    """What one `calibrate` call measures: the model's trace, its dtypes, device and cache."""

    batch: Any
    batch_size: int
    dtypes: tuple[str, ...]
    profile: HardwareProfile
    device: str
    trace: ModelTrace
    counts: Mapping[str, LayerCost]
    cache: MeasurementCache
    jit_compile: bool


def _setting(
    model: keras.Model,
    batch: Any,
    dtypes: Sequence[str],
    hardware: HardwareProfile | str,
    cache_dir: str | os.PathLike | None,
    use_cache: bool,
) -> _Setting:
    """Traces `model` on `batch`'s inputs and opens the cache of this device and versions."""
    names = [canonical_dtype(dtype) for dtype in dtypes]
    if FLOAT32 not in names:
        names = [FLOAT32, *names]
    profile = resolve_hardware(hardware)
    if FLOAT8 in names and not float8_timeable(profile):
        logger.info(
            "autoprec.calibrate: float8 not timed: %s has no FP8 tensor cores "
            "(float8 there is emulated, slower than bfloat16).",
            profile.display_name,
        )
        names = [name for name in names if name != FLOAT8]
    inputs = input_part(batch)
    trace = trace_model(model, inputs)
    device = profile.display_name
    if profile.kind == "cpu":
        device = f"{device} ({os.cpu_count()} cpus)"
    directory = None
    if use_cache:
        directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return _Setting(
        batch=batch,
        batch_size=batch_size_of(inputs, error_class=PlanError),
        dtypes=tuple(names),
        profile=profile,
        device=device,
        trace=trace,
        counts=count_costs(model, trace),
        cache=MeasurementCache(directory, device, framework_versions()),
        jit_compile=bool(getattr(model, "jit_compile", False) is True),
    )


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
    measure_mixed_steps: bool = True,
    time_budget: float | None = None,
    layers_per_kind: int | None = None,
) -> CostTable:
    """Measures every layer's forward+backward time in each dtype on this device.

    On Keras' TensorFlow backend (`tf.function`, XLA under `jit_compile=True`)
    or JAX backend (`jax.jit`), each computing layer is rebuilt alone with the
    dtype's policy, at the shapes it sees in the model on `x`, and its compiled
    forward+backward on random inputs is timed (median of `repeats`); layers
    that cannot be rebuilt get the roofline prediction, flagged in `source`.
    Casts and whole training steps of uniform copies of the model
    (`measure_train_steps`) are timed too; what the summed layers miss of each
    step becomes `step_overhead_seconds` and `layer_time_scale_by_dtype`, so
    that `estimate` of a measured uniform plan equals its step. For each 16-bit
    dtype the device runs fast whose uniform step is timed (float32's too), a
    mixed plan alternating it with float32 among the layers with weights is
    timed in the same rounds, and what its step shows beyond the prediction
    becomes the cost of a dtype boundary (`boundary_seconds`); a second mixed
    plan (the first half of those layers 16-bit), left out of that fit, checks
    it: its error and the noise of the timed rounds are `relative_error`
    (`boundaries.fit_boundary_cost`). Every measurement is cached (device,
    versions, layer signature and shapes).

    Args:
        model: a built Keras model.
        x: one training batch, inputs alone or an `(x, y)` tuple; the inputs may
            be an array, a list, a dict or any nesting of them, as the model takes
            them. Every shape is timed as it is here (the batch size too), so pass
            a batch `fit` feeds: dimensions the model leaves dynamic (a sequence
            length) come from it.
        dtypes: compute dtypes to time.
        hardware: what this device is, for the predictions of layers that cannot be
            timed alone and for which dtypes run natively: `"local"` (detected), a
            hardware profile name or a `HardwareProfile`. The timings are always of
            this device.
        repeats: timed repetitions per measurement (median).
        measure_model_step: which whole training steps to time: `True` (or
            `"all"`) every dtype of `dtypes`; a list of dtypes (from `dtypes`);
            `"fast"` only those `hardware` runs natively; `False` none.
        cache_dir: cache folder; default `$AUTOPREC_CACHE_DIR` or `~/.cache/autoprec`.
        use_cache: read and write the cache.
        verbose: 0 silent, 1 (default) a `keras.utils.Progbar` over the layers timed.
        measure_mixed_steps: whether to time the two mixed plans (a few extra
            steps and one compilation each, the first time) that learn the
            boundary cost and `relative_error`; without them `relative_error` is
            `DEFAULT_RELATIVE_ERROR` (or the noise of the uniform steps, if larger).
        time_budget: seconds calibration may take, whole steps first; a layer not
            timed (nor cached) when they have run out gets the roofline prediction,
            flagged in its `source` and counted in `stats["out_of_time"]`. `None`:
            no limit.
        layers_per_kind: time at most this many layers of each class (the most
            expensive, then others spread over the kind's sizes); the others of the
            kind get their roofline prediction scaled as the timed ones showed
            (`autoprec.cost.sampling`), counted in `stats["scaled"]`, unless cached.
            `None` (default): every layer is timed.

    Returns:
        A `CostTable` with `source="measured"`; `stats` counts `"timed"`,
        `"cached"` and `"fallback"` layer measurements, `"model_step"` uniform
        whole steps (`"model_steps_timed"` of them timed now) and `"mixed_step"`
        mixed ones (`"mixed_steps_timed"`).

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
    measuring_backend("calibrate()")
    deadline = None if time_budget is None else time.perf_counter() + float(time_budget)
    setting = _setting(model, x, dtypes, hardware, cache_dir, use_cache)
    stats = {"timed": 0, "cached": 0, "fallback": 0, "out_of_time": 0, "scaled": 0}
    # Whole steps are timed first, in a process not yet crowded by per-layer functions.
    steps = _whole_steps(measure_model_step, setting)
    plans = _mixed_plans(model, steps, setting.profile) if measure_mixed_steps else {}
    uniform, mixed, noise = measure_whole_steps(
        model,
        x,
        steps,
        setting.profile,
        cache=setting.cache,
        repeats=repeats,
        jit_compile=setting.jit_compile,
        stats=stats,
        plans={name: plan.dtypes for name, plan in plans.items()},
    )
    dispatch_seconds = _dispatch_seconds(setting.cache, repeats)
    timing = _LayerTiming(
        setting, repeats, stats, dispatch_seconds, None, deadline, layers_per_kind
    )
    table = _measured_table(model, setting, _measure_layers(model, timing, verbose), stats)
    table.cast_seconds = _measure_casts(setting.dtypes, setting.cache, repeats, dispatch_seconds)
    attribute_step_overhead(table, uniform)
    fit_boundary_cost(model, table, plans, mixed, noise)
    return table


def _whole_steps(requested: bool | str | Sequence[str], setting: _Setting) -> list[str]:
    """Returns the dtypes whose uniform whole step is timed: float8's never (`whole_step_dtypes`)."""
    if isinstance(requested, (list, tuple)) or (
        isinstance(requested, str) and requested.strip().lower() not in ("all", "fast")
    ):
        names = [requested] if isinstance(requested, str) else list(requested)
        requested = [name for name in names if canonical_dtype(name) != FLOAT8]
    steps = [dtype for dtype in setting.dtypes if dtype != FLOAT8]
    return whole_step_dtypes(requested, steps, setting.profile)


def _mixed_plans(
    model: keras.Model, steps: Sequence[str], profile: HardwareProfile
) -> dict[str, MixedPlan]:
    """Returns the mixed plans to time: those of the fast 16-bit dtypes whose uniform step is timed."""
    if FLOAT32 not in steps:
        return {}
    halves = [dtype for dtype in steps if dtype != FLOAT32 and profile.support(dtype) == FAST]
    try:
        return mixed_plans(model, halves)
    except Exception:  # noqa: BLE001 - a model whose layers cannot be listed: no mixed steps
        return {}


def _measured_table(
    model: keras.Model,
    setting: _Setting,
    layers: dict[str, LayerCostRecord],
    stats: dict[str, int],
) -> CostTable:
    """Returns the `CostTable` of measured `layers` (casts and step correction still to add)."""
    return CostTable(
        device=setting.device,
        source="measured",
        batch_size=setting.batch_size,
        layers=layers,
        edges=[
            (edge.producer, edge.consumer, edge.elements_per_sample) for edge in setting.trace.edges
        ],
        cast_seconds={},
        layer_fixed_seconds=0.0,
        memory_bytes=setting.profile.memory_bytes,
        model_fingerprint=model_fingerprint(model),
        versions=setting.cache.versions,
        stats=stats,
    )


def _dispatch_seconds(cache: MeasurementCache, repeats: int) -> float:
    """Returns the seconds of an empty compiled call (subtracted from each layer's), cached."""
    key = cache.key({"dispatch": True})
    seconds = cache.get(key)
    if seconds is None:
        seconds = time_empty_function(repeats)
        cache.put(key, seconds, "empty compiled call")
    return seconds


@dataclasses.dataclass(frozen=True)
class _LayerTiming:
    """How `calibrate` times each layer: its setting, repeats, counters, dispatch, progress bar."""

    setting: _Setting
    repeats: int
    stats: dict[str, int]
    dispatch_seconds: float
    bar: keras.utils.Progbar | None
    deadline: float | None = None
    per_kind: int | None = None


def _measure_layers(
    model: keras.Model, timing: _LayerTiming, verbose: int
) -> dict[str, LayerCostRecord]:
    """Returns every layer's record: measured, cached or predicted (free layers cost 0 s)."""
    setting = timing.setting
    dtypes, batch_size = setting.dtypes, setting.batch_size
    work = [path for path, cost in setting.counts.items() if _measurable(cost)]
    sample = sample_kinds(setting.counts, work, timing.per_kind, setting.profile, batch_size)
    if verbose and sample.timed:
        total = sum(len(_layer_dtypes(setting.counts[path], dtypes)) for path in sample.timed)
        timing = dataclasses.replace(timing, bar=keras.utils.Progbar(total, unit_name="timing"))
    paths = layer_paths(model)
    layers: dict[str, LayerCostRecord] = {}
    timed: dict[str, dict[str, float | None]] = {}
    for path, cost in setting.counts.items():
        layer_dtypes = _layer_dtypes(cost, dtypes)
        if path not in work:
            seconds, source = dict.fromkeys(layer_dtypes, 0.0), "measured"
        elif path in sample.predicted_from:
            seconds = _cached_seconds(paths[path], setting.trace.calls[path], cost, timing)
            if seconds is None:
                continue  # predicted below, as the timed layers of its kind showed
            source = "cached"
        else:
            seconds, source = _measure_layer(paths[path], setting.trace.calls[path], cost, timing)
            if not source.startswith("predicted"):
                timed[path] = seconds
        layers[path] = roofline_record(cost, seconds, batch_size, layer_dtypes, source)
    scales = kind_scales(timed, setting.counts, setting.profile, batch_size)
    for path, kind in sample.predicted_from.items():
        if path in layers:
            continue
        cost = setting.counts[path]
        layer_dtypes = _layer_dtypes(cost, dtypes)
        seconds = scaled_seconds(cost, layer_dtypes, scales, setting.profile, batch_size)
        source = f"predicted, scaled as the timed {kind} layers showed"
        layers[path] = roofline_record(cost, seconds, batch_size, layer_dtypes, source)
        timing.stats["scaled"] += 1
    layers = {path: layers[path] for path in setting.counts}
    _subtract_children(layers, setting.counts)
    return layers


def _call_key(layer: keras.layers.Layer, call: LayerCall, dtype: str, setting: _Setting) -> str:
    """The cache key of one recorded call of `layer` in `dtype` on this device."""
    return setting.cache.key(
        {"layer": layer_signature(layer, call, setting.batch_size), "dtype": dtype}
    )


def _cached_seconds(
    layer: keras.layers.Layer, calls: Sequence[LayerCall], cost: LayerCost, timing: _LayerTiming
) -> dict[str, float | None] | None:
    """One layer's seconds per dtype from the cache alone; `None` if any call is not cached."""
    setting = timing.setting
    seconds: dict[str, float | None] = {}
    for dtype in _layer_dtypes(cost, setting.dtypes):
        values = [setting.cache.get(_call_key(layer, call, dtype, setting)) for call in calls]
        if any(value is None for value in values):
            return None
        seconds[dtype] = sum(values)
    timing.stats["cached"] += sum(len(calls) for _ in seconds)  # as `_time_one_call` counts
    return seconds


def _time_one_call(
    layer: keras.layers.Layer, call: LayerCall, dtype: str, timing: _LayerTiming
) -> tuple[float, str]:
    """Returns `(seconds, "cached" | "measured")` of one recorded call of `layer` in `dtype`."""
    setting = timing.setting
    key = _call_key(layer, call, dtype, setting)
    value = setting.cache.get(key)
    if value is not None:
        timing.stats["cached"] += 1
        return value, "cached"
    if timing.deadline is not None and time.perf_counter() > timing.deadline:
        timing.stats["out_of_time"] += 1
        raise TimeoutError("out of the time budget; predicted")
    value = time_layer(layer, call, dtype, setting.batch_size, timing.repeats, setting.jit_compile)
    value = max(value - timing.dispatch_seconds, 0.05 * value)
    setting.cache.put(key, value, f"{call.class_name} {call.path} {dtype}")
    timing.stats["timed"] += 1
    return value, "measured"


def _measure_layer(
    layer: keras.layers.Layer, calls: Sequence[LayerCall], cost: LayerCost, timing: _LayerTiming
) -> tuple[dict[str, float | None], str]:
    """Measures (or reads from cache, or predicts as a fallback) one layer in each dtype."""
    setting = timing.setting
    seconds: dict[str, float | None] = {}
    sources = set()
    for dtype in _layer_dtypes(cost, setting.dtypes):
        total = 0.0
        for call in calls:
            try:
                value, source = _time_one_call(layer, call, dtype, timing)
                sources.add(source)
            except Exception as error:  # noqa: BLE001 - any failure falls back, flagged
                predicted = predicted_layer_seconds(
                    cost, setting.profile, dtype, setting.batch_size
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
    """Removes the children's time from containers timed whole (MultiHeadAttention)."""
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
