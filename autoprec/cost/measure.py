"""Calibration: every layer's forward+backward seconds per dtype measured on this device, and the
mixed plans timed whole that teach what a boundary between dtypes costs a step."""

from __future__ import annotations

import collections
import contextlib
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
from ..hardware import HardwareProfile, detect, resolve_hardware
from ..layers import is_graph_model, layer_paths, model_fingerprint
from .estimate import estimate
from .layer_calls import LayerCall, ModelTrace, trace_model
from .prediction import LayerCost, count_costs, predicted_layer_seconds, roofline_record
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
from .table import (
    DEFAULT_RELATIVE_ERROR,
    CostTable,
    LayerCostRecord,
    MeasurementCache,
    default_cache_dir,
    layer_signature,
)

logger = logging.getLogger("autoprec")


def _measure_casts(
    dtypes: Sequence[str], cache: MeasurementCache, repeats: int, dispatch_seconds: float
) -> dict[str, dict[str, float]]:
    """Fits `fixed + per_element x n` for one cast between float32 and each 16-bit dtype."""
    small, large = 1024, 1 << 21
    result = {}
    for dtype in [dtype for dtype in dtypes if dtype != FLOAT32]:
        # At least 9 rounds: a 1024-value cast takes microseconds, and one round disturbed by
        # another process would set its fixed cost alone.
        timings = [
            cache.measured(
                {"cast": dtype, "elements": elements},
                f"cast float32<->{dtype}, {elements} elements",
                lambda dtype=dtype, elements=elements: time_cast(dtype, elements, max(repeats, 9)),
            )
            for elements in (small, large)
        ]
        per_element = max((timings[1] - timings[0]) / (large - small), 0.0)
        fixed = max(timings[0] - per_element * small - dispatch_seconds / 2.0, 0.0)
        result[dtype] = {"fixed": fixed, "per_element": per_element}
    return result


def _measurable(cost: LayerCost) -> bool:
    return not cost.is_free and "counted in" not in cost.note


def float8_timeable(profile: HardwareProfile) -> bool:
    """Returns whether `calibrate` may time float8 on this device described by `profile`."""
    return profile.supports_float8 and (profile.detected or detect().supports_float8)


def _layer_dtypes(cost: LayerCost, dtypes: Sequence[str]) -> tuple[str, ...]:
    """Returns the dtypes one layer is timed in: float8 only for a layer with a float8 path."""
    return tuple(dtype for dtype in dtypes if dtype != FLOAT8 or cost.has_float8_path)


@dataclasses.dataclass(frozen=True)
class _Setting:
    """What one `calibrate` call measures and how."""

    batch_size: int
    dtypes: tuple[str, ...]
    profile: HardwareProfile
    trace: ModelTrace
    counts: Mapping[str, LayerCost]
    cache: MeasurementCache
    jit_compile: bool
    repeats: int
    stats: dict[str, int]
    deadline: float | None = None
    per_kind: int | None = None
    dispatch_seconds: float = 0.0
    bar: keras.utils.Progbar | None = None


def _setting(
    model: keras.Model,
    batch: Any,
    dtypes: Sequence[str],
    hardware: HardwareProfile | str,
    cache_dir: str | os.PathLike | None,
    use_cache: bool,
    **how: Any,
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
    device = profile.display_name + (f" ({os.cpu_count()} cpus)" if profile.kind == "cpu" else "")
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return _Setting(
        batch_size=batch_size_of(inputs, error_class=PlanError),
        dtypes=tuple(names),
        profile=profile,
        trace=trace,
        counts=count_costs(model, trace),
        cache=MeasurementCache(directory if use_cache else None, device, framework_versions()),
        jit_compile=bool(getattr(model, "jit_compile", False) is True),
        **how,
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

    Args:
        model: a built Keras model.
        x: one training batch as `fit` feeds it, inputs alone or `(x, y)`: its shapes are timed.
        dtypes: compute dtypes to time (`"float8"` only on a device with FP8 tensor cores).
        hardware: `"local"`, a profile name or a `HardwareProfile`: what `"fast"` means, and the
            predictions of layers that cannot be timed alone.
        repeats: timed repetitions per measurement (median).
        measure_model_step: uniform whole steps to time: `True`/`"all"`, `"fast"`, a list of
            dtypes from `dtypes`, or `False`.
        cache_dir: cache folder; default `$AUTOPREC_CACHE_DIR` or `~/.cache/autoprec`.
        use_cache: read and write the cache.
        verbose: 0 silent, 1 a progress bar over the layers timed.
        measure_mixed_steps: time the two mixed plans (else `relative_error` is
            `DEFAULT_RELATIVE_ERROR`, or the noise if larger).
        time_budget: seconds it may take, whole steps first; layers left get the roofline
            prediction (`stats["out_of_time"]`). `None`: no limit.
        layers_per_kind: time at most this many layers of each class, the others predicted as
            the timed ones showed (`stats["scaled"]`). `None`: every layer is timed.

    Returns:
        A `CostTable` with `source="measured"` and its `stats`.

    Raises:
        PlanError: if `measure_model_step` names a dtype not in `dtypes`.
        BackendError: on a Keras backend other than TensorFlow or JAX.

    Example:

    ```python
    x, y = data
    costs = autoprec.calibrate(model, (x[:32], y[:32]), verbose=0)
    print(costs.summary())
    ```
    """
    measuring_backend("calibrate()")
    deadline = None if time_budget is None else time.perf_counter() + float(time_budget)
    stats = {"timed": 0, "cached": 0, "fallback": 0, "out_of_time": 0, "scaled": 0}
    how = {"repeats": repeats, "stats": stats, "deadline": deadline, "per_kind": layers_per_kind}
    setting = _setting(model, x, dtypes, hardware, cache_dir, use_cache, **how)
    # Whole steps are timed first, in a process not yet crowded by per-layer functions.
    steps = whole_step_dtypes(measure_model_step, setting.dtypes, setting.profile)
    # The mixed plans of the fast 16-bit dtypes whose uniform step is timed.
    halves = [dtype for dtype in steps if dtype != FLOAT32 and setting.profile.is_fast(dtype)]
    plans: dict[str, MixedPlan] = {}
    if measure_mixed_steps and FLOAT32 in steps:
        with contextlib.suppress(Exception):  # a model whose layers cannot be listed: none
            plans = mixed_plans(model, halves)
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
    dispatch_seconds = setting.cache.measured(
        {"dispatch": True}, "empty compiled call", lambda: time_empty_function(repeats)
    )
    setting = dataclasses.replace(setting, dispatch_seconds=dispatch_seconds)
    table = CostTable(
        device=setting.cache.device,
        source="measured",
        batch_size=setting.batch_size,
        layers=_measure_layers(model, setting, verbose),
        edges=[dataclasses.astuple(edge) for edge in setting.trace.edges],
        cast_seconds=_measure_casts(setting.dtypes, setting.cache, repeats, dispatch_seconds),
        memory_bytes=setting.profile.memory_bytes,
        model_fingerprint=model_fingerprint(model),
        versions=setting.cache.versions,
        stats=stats,
    )
    attribute_step_overhead(table, uniform)
    fit_boundary_cost(model, table, plans, mixed, noise)
    return table


def _measure_layers(
    model: keras.Model, setting: _Setting, verbose: int
) -> dict[str, LayerCostRecord]:
    """Returns every layer's record: measured, cached or predicted (free layers cost 0 s)."""
    dtypes, batch_size = setting.dtypes, setting.batch_size
    work = [path for path, cost in setting.counts.items() if _measurable(cost)]
    timed_paths, predicted_from = sample_kinds(
        setting.counts, work, setting.per_kind, setting.profile, batch_size
    )
    if verbose and timed_paths:
        total = sum(len(_layer_dtypes(setting.counts[path], dtypes)) for path in timed_paths)
        setting = dataclasses.replace(setting, bar=keras.utils.Progbar(total, unit_name="timing"))
    paths = layer_paths(model)
    layers: dict[str, LayerCostRecord] = {}
    timed: dict[str, dict[str, float | None]] = {}
    for path, cost in setting.counts.items():
        if path not in work:
            seconds, source = dict.fromkeys(_layer_dtypes(cost, dtypes), 0.0), "measured"
        elif path in predicted_from:
            seconds = _cached_seconds(paths[path], setting.trace.calls[path], cost, setting)
            if seconds is None:
                continue  # predicted below, as the timed layers of its kind showed
            source = "cached"
        else:
            seconds, source = _measure_layer(paths[path], setting.trace.calls[path], cost, setting)
            if not source.startswith("predicted"):
                timed[path] = seconds
        layers[path] = roofline_record(cost, seconds, batch_size, source)
    scales = kind_scales(timed, setting.counts, setting.profile, batch_size)
    for path, kind in predicted_from.items():
        if path in layers:
            continue
        cost = setting.counts[path]
        seconds = scaled_seconds(
            cost, _layer_dtypes(cost, dtypes), scales, setting.profile, batch_size
        )
        source = f"predicted, scaled as the timed {kind} layers showed"
        layers[path] = roofline_record(cost, seconds, batch_size, source)
        setting.stats["scaled"] += 1
    layers = {path: layers[path] for path in setting.counts}
    _subtract_children(layers, setting.counts)
    return layers


def _call_key(layer: keras.layers.Layer, call: LayerCall, dtype: str, setting: _Setting) -> str:
    """The cache key of one recorded call of `layer` in `dtype` on this device."""
    return setting.cache.key(
        {"layer": layer_signature(layer, call, setting.batch_size), "dtype": dtype}
    )


def _cached_seconds(
    layer: keras.layers.Layer, calls: Sequence[LayerCall], cost: LayerCost, setting: _Setting
) -> dict[str, float | None] | None:
    """One layer's seconds per dtype from the cache alone; `None` if any call is not cached."""
    seconds: dict[str, float | None] = {}
    for dtype in _layer_dtypes(cost, setting.dtypes):
        values = [setting.cache.get(_call_key(layer, call, dtype, setting)) for call in calls]
        if any(value is None for value in values):
            return None
        seconds[dtype] = sum(values)
    setting.stats["cached"] += sum(len(calls) for _ in seconds)  # as `_time_one_call` counts
    return seconds


def _time_one_call(
    layer: keras.layers.Layer, call: LayerCall, dtype: str, setting: _Setting
) -> tuple[float, str]:
    """Returns `(seconds, "cached" | "measured")` of one recorded call of `layer` in `dtype`."""
    key = _call_key(layer, call, dtype, setting)
    value = setting.cache.get(key)
    if value is not None:
        setting.stats["cached"] += 1
        return value, "cached"
    if setting.deadline is not None and time.perf_counter() > setting.deadline:
        setting.stats["out_of_time"] += 1
        raise TimeoutError("out of the time budget; predicted")
    value = time_layer(layer, call, dtype, setting.batch_size, setting.repeats, setting.jit_compile)
    value = max(value - setting.dispatch_seconds, 0.05 * value)
    setting.cache.put(key, value, f"{call.class_name} {call.path} {dtype}")
    setting.stats["timed"] += 1
    return value, "measured"


def _measure_layer(
    layer: keras.layers.Layer, calls: Sequence[LayerCall], cost: LayerCost, setting: _Setting
) -> tuple[dict[str, float | None], str]:
    """Measures (or reads from cache, or predicts as a fallback) one layer in each dtype."""
    seconds: dict[str, float | None] = {}
    sources = set()
    for dtype in _layer_dtypes(cost, setting.dtypes):
        total = 0.0
        for call in calls:
            try:
                value, source = _time_one_call(layer, call, dtype, setting)
                sources.add(source)
            except Exception as error:  # noqa: BLE001 - any failure falls back, flagged
                predicted = predicted_layer_seconds(
                    cost, setting.profile, dtype, setting.batch_size
                )
                setting.stats["fallback"] += 1
                sources.add(f"predicted (fallback: {type(error).__name__}: {error})"[:200])
                if predicted is None:
                    total = math.inf
                    break
                value = predicted / max(len(calls), 1)
            total += value
        seconds[dtype] = None if math.isinf(total) else total
        if setting.bar is not None:
            setting.bar.add(1)
    fallback = next((source for source in sources if source.startswith("predicted")), None)
    return seconds, fallback or ("measured" if "measured" in sources else "cached")


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


def sample_kinds(
    counts: Mapping[str, LayerCost],
    work: Sequence[str],
    per_kind: int | None,
    profile: HardwareProfile,
    batch_size: int,
) -> tuple[frozenset[str], dict[str, str]]:
    """Returns `(timed paths, {predicted path: class name})`: up to `per_kind` layers of each
    class timed, the most expensive first and others spread by size; `None` times all."""
    if per_kind is None:
        return frozenset(work), {}
    by_kind: dict[str, list[str]] = collections.defaultdict(list)
    for path in work:
        by_kind[counts[path].class_name].append(path)
    timed: set[str] = set()
    predicted_from: dict[str, str] = {}
    for kind, paths in by_kind.items():
        predicted = {
            path: predicted_layer_seconds(counts[path], profile, FLOAT32, batch_size) or 0.0
            for path in paths
        }
        ranked = sorted(paths, key=lambda path: -predicted[path])
        chosen = _spread(ranked, max(per_kind, 1))
        timed.update(chosen)
        predicted_from.update({path: kind for path in ranked if path not in chosen})
    return frozenset(timed), predicted_from


def _spread(ranked: Sequence[str], count: int) -> list[str]:
    """The first of `ranked` and others evenly spaced to its end, `count` in all."""
    if len(ranked) <= count:
        return list(ranked)
    if count == 1:
        return [ranked[0]]
    step = (len(ranked) - 1) / (count - 1)
    return list(dict.fromkeys(ranked[round(index * step)] for index in range(count)))


def kind_scales(
    measured: Mapping[str, Mapping[str, float | None]],
    counts: Mapping[str, LayerCost],
    profile: HardwareProfile,
    batch_size: int,
) -> dict[tuple[str, str], float]:
    """Returns measured over predicted seconds of the timed layers, per `(class name, dtype)`."""
    sums: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for path, seconds in measured.items():
        for dtype, value in seconds.items():
            predicted = predicted_layer_seconds(counts[path], profile, dtype, batch_size)
            if value is None or not predicted:
                continue
            totals = sums[(counts[path].class_name, dtype)]
            totals[0] += value
            totals[1] += predicted
    return {key: total / predicted for key, (total, predicted) in sums.items() if predicted > 0}


def scaled_seconds(
    cost: LayerCost,
    dtypes: Sequence[str],
    scales: Mapping[tuple[str, str], float],
    profile: HardwareProfile,
    batch_size: int,
) -> dict[str, float | None]:
    """Returns a layer's predicted seconds per dtype, scaled as the timed layers of its kind showed."""
    seconds: dict[str, float | None] = {}
    for dtype in dtypes:
        predicted = predicted_layer_seconds(cost, profile, dtype, batch_size)
        scale = scales.get((cost.class_name, dtype), 1.0)
        seconds[dtype] = None if predicted is None else predicted * scale
    return seconds


#: Lowest `CostTable.relative_error` a calibration reports: one held-out plan does not
#: vouch for every plan to better than this.
MIN_RELATIVE_ERROR = 0.02

#: The patterns of `mixed_plans`: every other layer with weights in 16-bit, or the first half.
PATTERNS = ("alternating", "half")


@dataclasses.dataclass(frozen=True)
class MixedPlan:
    """A mixed-dtype plan whose whole step `calibrate` times."""

    name: str
    dtype: str
    pattern: str
    dtypes: Mapping[str, str]


def _units(paths: Mapping[str, keras.layers.Layer]) -> dict[str, str]:
    """Returns `{path: unit path}`: the outermost layer around it that is not a graph model."""
    units = {}
    for path in paths:
        parts = path.split("/")
        prefixes = ("/".join(parts[:depth]) for depth in range(1, len(parts)))
        outer = [prefix for prefix in prefixes if prefix in paths]
        units[path] = next((p for p in outer if not is_graph_model(paths[p])), path)
    return units


def mixed_assignment(model: keras.Model, dtype: str, pattern: str) -> dict[str, str]:
    """Returns `{path: dtype}` of every layer of `model` under one mixed pattern."""
    if pattern not in PATTERNS:
        raise ValueError(f"mixed_assignment: pattern {pattern!r} is not one of {PATTERNS}.")
    dtype = canonical_dtype(dtype, "mixed_assignment")
    paths = layer_paths(model)
    units = _units(paths)
    order = list(dict.fromkeys(units[path] for path in paths if not is_graph_model(paths[path])))
    weighted = [unit for unit in order if paths[unit].weights]
    chosen: dict[str, str] = {}
    for index, unit in enumerate(weighted if len(weighted) >= 2 else []):
        in_half = index % 2 == 0 if pattern == "alternating" else index < len(weighted) // 2
        chosen[unit] = dtype if in_half else FLOAT32
    current, unit_dtype = FLOAT32, {}
    for unit in order:
        current = chosen.get(unit, current)
        unit_dtype[unit] = current
    assignment = {}
    for path in paths:
        # A graph model computes in the dtype of its first layer that is not one.
        inner = [path, *(other for other in paths if other.startswith(path + "/"))]
        first = next((other for other in inner if not is_graph_model(paths[other])), None)
        assignment[path] = unit_dtype[units[first]] if first is not None else FLOAT32
    return assignment


def mixed_plans(model: keras.Model, dtypes: Sequence[str]) -> dict[str, MixedPlan]:
    """Returns the mixed plans `calibrate` times: alternating per dtype, half for the first."""
    plans: list[MixedPlan] = []
    halves = [canonical_dtype(dtype) for dtype in dtypes if canonical_dtype(dtype) != FLOAT32]
    for position, dtype in enumerate(halves):
        alternating = mixed_assignment(model, dtype, "alternating")
        if all(value == FLOAT32 for value in alternating.values()):
            return {}
        plans.append(MixedPlan(f"alternating {dtype}", dtype, "alternating", alternating))
        half = mixed_assignment(model, dtype, "half")
        if position == 0 and half != alternating:
            plans.append(MixedPlan(f"half {dtype}", dtype, "half", half))
    return {plan.name: plan for plan in plans}


def boundaries(table: CostTable, dtypes: Mapping[str, str]) -> list[tuple[str, int]]:
    """Returns `(16-bit dtype, elements per sample)` of each boundary between two layers."""
    found = []
    for producer, consumer, elements in table.edges:
        if producer is None:
            continue
        source, target = dtypes.get(producer, FLOAT32), dtypes.get(consumer, FLOAT32)
        if source != target:
            found.append((target if target != FLOAT32 else source, int(elements)))
    return found


def _fit_one(table: CostTable, plan: MixedPlan, residual: float) -> dict[str, float]:
    """Returns the boundary figures that make `plan`'s step `residual` seconds longer."""
    crossing = [
        elements * table.batch_size
        for dtype, elements in boundaries(table, plan.dtypes)
        if dtype == plan.dtype
    ]
    if not crossing:
        return {"fixed": 0.0, "per_element": 0.0}
    cast = table.cast_seconds.get(plan.dtype) or {}
    fixed, per_element = 2.0 * cast.get("fixed", 0.0), 2.0 * cast.get("per_element", 0.0)
    shape = sum(fixed + per_element * elements for elements in crossing)
    if shape <= 0:
        return {"fixed": max(residual, 0.0) / len(crossing), "per_element": 0.0}
    factor = max(residual / shape, -1.0)
    return {"fixed": factor * fixed, "per_element": factor * per_element}


def fit_boundary_cost(
    model: keras.Model,
    table: CostTable,
    plans: Mapping[str, MixedPlan],
    measured: Mapping[str, float],
    noise: float | None = None,
) -> None:
    """Learns `table.boundary_seconds` from measured mixed steps and sets `relative_error`."""
    runs = {name: plans[name] for name in measured if name in plans and measured[name] > 0}
    table.boundary_seconds = {}
    table.measured_plan_seconds = {name: float(measured[name]) for name in runs}

    def predicted(plan: MixedPlan) -> float:
        return float(estimate(model, dict(plan.dtypes), costs=table).step_seconds)

    before = {name: predicted(plan) for name, plan in runs.items()}
    errors = {f"{name}, no boundary cost": before[name] / measured[name] - 1.0 for name in runs}
    fitted = {}
    for name, plan in runs.items():
        if plan.pattern != "alternating":
            continue
        # A residual inside the noise of the rounds teaches nothing about boundaries: the
        # dtype's boundaries then cost nothing beyond their casts (not the other dtypes' figures).
        residual = measured[name] - before[name]
        if noise is not None and abs(before[name] / measured[name] - 1.0) <= noise:
            residual = 0.0
        fitted[plan.dtype] = _fit_one(table, plan, residual)
    table.boundary_seconds = fitted
    errors.update({name: predicted(plan) / measured[name] - 1.0 for name, plan in runs.items()})
    held_out = any(plan.pattern != "alternating" for plan in runs.values())
    floor = MIN_RELATIVE_ERROR if held_out else DEFAULT_RELATIVE_ERROR
    checks = [abs(errors[name]) for name in runs]
    if noise is not None:
        errors["noise"] = float(noise)
        checks.append(float(noise))
    table.relative_error = float(max([floor, *checks]))
    table.prediction_errors = errors
