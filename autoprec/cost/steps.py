"""Whole training steps: copies of a model timed under uniform or mixed policies, and what they
correct in a table."""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import numpy as np

from .._core.data import batch_size_of, flat_arrays, input_part, slice_batch, target_part
from .._core.dtypes import FLOAT32, canonical_dtype
from .._core.models import fresh_optimizer
from .._core.timing import Timing, time_interleaved
from ..errors import PlanError
from ..hardware import FAST, HardwareProfile
from .cache import MeasurementCache, model_signature
from .clones import clone_with_policies, clone_with_uniform_policy
from .table import CostTable
from .timers import SLOW_ROUNDS, SLOW_SECONDS, measuring_backend

#: Smallest per-dtype layer-time scale (guards against a step measured absurdly fast).
MIN_TIME_SCALE = 0.05

#: Standard deviation of normal noise per median absolute deviation.
_DEVIATION_PER_MAD = 1.4826

logger = logging.getLogger("autoprec")


def _random_targets(clone: keras.Model, inputs: Any) -> Any:
    """Returns random float32 targets shaped like `clone`'s outputs on `inputs`' batch."""
    outputs = clone(slice_batch(inputs, 1))
    batch_size = batch_size_of(inputs, error_class=PlanError)
    rng = np.random.default_rng(0)
    return keras.tree.map_structure(
        lambda t: rng.standard_normal((batch_size, *t.shape[1:])).astype("float32"), outputs
    )


def _step_function(
    model: keras.Model, batch: Any, plan: str | Mapping[str, str], jit_compile: bool
) -> Callable[[], Any]:
    """Returns a zero-argument function running one training step of a copy of `model`."""
    inputs = input_part(batch)
    targets = target_part(batch)
    if isinstance(plan, str):
        clone = clone_with_uniform_policy(model, plan)
        uses_float16 = canonical_dtype(plan) == "float16"
    else:
        clone = clone_with_policies(model, plan)
        uses_float16 = any(canonical_dtype(dtype) == "float16" for dtype in plan.values())
    loss = getattr(model, "loss", None) if targets is not None else None
    if targets is None or loss is None:
        targets = _random_targets(clone, inputs)
        loss = "mse"
    optimizer = fresh_optimizer(getattr(model, "optimizer", None))
    if uses_float16:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    clone.compile(optimizer=optimizer, loss=loss, jit_compile=jit_compile)
    # On JAX the batch goes to the device once, as a prefetching input pipeline would.
    inputs, targets = measuring_backend("measure_train_steps()").to_device((inputs, targets))
    return lambda: clone.train_on_batch(inputs, targets)


def time_train_steps(
    model: keras.Model,
    batch: Any,
    dtypes: Sequence[str] = (FLOAT32,),
    repeats: int = 5,
    jit_compile: bool = False,
    warmup: int = 2,
    *,
    plans: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Timing]:
    """Times whole training steps as `measure_train_steps` does, keeping every timed round."""
    measuring_backend("measure_train_steps()")
    names = [canonical_dtype(dtype) for dtype in dtypes]
    functions = {dtype: _step_function(model, batch, dtype, jit_compile) for dtype in names}
    for name, assignment in (plans or {}).items():
        try:
            function = _step_function(model, batch, assignment, jit_compile)
            function()  # its first warm-up: a plan that cannot run fails here
        except Exception as error:  # noqa: BLE001 - a plan that cannot run is not timed
            logger.info("autoprec.cost: whole step of plan %r not timed (%s)", name, error)
            continue
        functions[name] = function
    return time_interleaved(
        functions,
        rounds=repeats,
        warmup=warmup,
        slow_seconds=SLOW_SECONDS,
        slow_rounds=SLOW_ROUNDS,
    )


def measure_train_steps(
    model: keras.Model,
    batch: Any,
    dtypes: Sequence[str] = (FLOAT32,),
    repeats: int = 5,
    jit_compile: bool = False,
    warmup: int = 2,
    *,
    plans: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, float]:
    """Times whole training steps of copies of `model` under uniform policies, interleaved."""
    timings = time_train_steps(model, batch, dtypes, repeats, jit_compile, warmup, plans=plans)
    return {name: timing.median for name, timing in timings.items()}


def measure_train_step(
    model: keras.Model,
    batch: Any,
    dtype: str = FLOAT32,
    repeats: int = 5,
    jit_compile: bool = False,
    warmup: int = 2,
) -> float:
    """Times one whole training step of a copy of `model` under a uniform policy."""
    dtype = canonical_dtype(dtype)
    return measure_train_steps(model, batch, [dtype], repeats, jit_compile, warmup)[dtype]


def whole_step_dtypes(
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
class StepTiming:
    """Where and how `calibrate` times whole steps: cache, repeats, XLA, counters."""

    cache: MeasurementCache
    repeats: int
    jit_compile: bool
    stats: dict[str, int]


@dataclasses.dataclass(frozen=True)
class WholeSteps:
    """The whole steps `measure_whole_steps` measured (or read from the cache)."""

    uniform: dict[str, float]
    mixed: dict[str, float]
    noise: float | None


def step_spread(timing: Timing) -> float | None:
    """Returns the spread of a timing's rounds, in seconds (`None`: one round)."""
    samples = timing.samples
    if len(samples) < 2:
        return None
    middle = statistics.median(samples)
    return _DEVIATION_PER_MAD * statistics.median(abs(value - middle) for value in samples)


def measure_whole_steps(
    model: keras.Model,
    batch: Any,
    dtypes: Sequence[str],
    profile: HardwareProfile,
    timing: StepTiming,
    *,
    plans: Mapping[str, Mapping[str, str]] | None = None,
) -> WholeSteps:
    """Returns the measured whole steps, uniform and mixed, cached; none if the model cannot be
    copied."""
    timing.stats.update(
        {"model_step": 0, "model_steps_timed": 0, "mixed_step": 0, "mixed_steps_timed": 0}
    )
    plans = dict(plans or {})
    payloads: dict[str, dict[str, Any]] = {dtype: {"dtype": dtype} for dtype in dtypes}
    for name, assignment in plans.items():
        payloads[name] = {"plan": name, "dtypes": sorted(assignment.items())}
    keys = {
        name: _whole_step_key(model, batch, payload, timing) for name, payload in payloads.items()
    }
    error_keys = {
        name: _whole_step_key(model, batch, {**payload, "spread": True}, timing)
        for name, payload in payloads.items()
    }
    measured = {name: timing.cache.get(key) for name, key in keys.items()}
    errors = {name: timing.cache.get(key) for name, key in error_keys.items()}
    fast = [dtype for dtype in dtypes if profile.support(dtype) == FAST]
    fast += [
        name
        for name, assignment in plans.items()
        if all(profile.support(canonical_dtype(dtype)) == FAST for dtype in assignment.values())
    ]
    # The second warm-up step, past tracing, tells whether a step is slow.
    groups = [fast] if any(measured[name] is None for name in fast) else []
    groups += [[name] for name in payloads if name not in fast and measured[name] is None]
    stores = _StepStores(keys, error_keys, measured, errors)
    for group in groups:
        if not _time_group(model, batch, group, dtypes, plans, timing, stores):
            return WholeSteps({}, {}, None)
    known = {name: seconds for name, seconds in measured.items() if seconds}
    spreads = [
        errors[name] / seconds for name, seconds in known.items() if errors[name] is not None
    ]
    steps = WholeSteps(
        uniform={name: seconds for name, seconds in known.items() if name in dtypes},
        mixed={name: seconds for name, seconds in known.items() if name in plans},
        noise=statistics.median(spreads) if spreads else None,
    )
    timing.stats["model_step"] = len(steps.uniform)
    timing.stats["mixed_step"] = len(steps.mixed)
    return steps


@dataclasses.dataclass(frozen=True)
class _StepStores:
    """The cache keys of each timed step and what is known of it so far (filled in place)."""

    keys: dict[str, str]
    error_keys: dict[str, str]
    measured: dict[str, float | None]
    errors: dict[str, float | None]


def _time_group(
    model: keras.Model,
    batch: Any,
    group: list[str],
    dtypes: Sequence[str],
    plans: Mapping[str, Mapping[str, str]],
    timing: StepTiming,
    stores: _StepStores,
) -> bool:
    """Times one group of steps together and caches each; False if the model cannot be copied."""
    uniform = [name for name in group if name in dtypes]
    mixed = {name: plans[name] for name in group if name in plans}
    try:
        timed = time_train_steps(
            model, batch, uniform, max(timing.repeats, 3), timing.jit_compile, 2, plans=mixed
        )
    except Exception:  # noqa: BLE001 - subclassed models cannot be cloned: no correction
        return False
    for name in group:
        kind = "mixed_steps_timed" if name in plans else "model_steps_timed"
        if name not in timed:  # a mixed plan that cannot run
            timing.cache.put(stores.keys[name], 0.0, f"whole {name} train step: does not run")
            stores.measured[name] = 0.0
            continue
        stores.measured[name] = timed[name].median
        stores.errors[name] = step_spread(timed[name])
        timing.cache.put(stores.keys[name], stores.measured[name], f"whole {name} train step")
        if stores.errors[name] is not None:
            timing.cache.put(
                stores.error_keys[name],
                stores.errors[name],
                f"whole {name} step: spread of its rounds",
            )
        timing.stats[kind] += 1
    return True


def _whole_step_key(
    model: keras.Model, batch: Any, payload: Mapping[str, Any], timing: StepTiming
) -> str:
    """Returns the cache key of one whole step of `model` on `batch`'s shapes."""
    shapes = [list(array.shape) for array in flat_arrays(batch)]
    return timing.cache.key(
        {
            "model_step": model_signature(model),
            "shapes": shapes,
            "jit": timing.jit_compile,
            **payload,
        }
    )


def _uniform_step_parts(table: CostTable, dtype: str) -> tuple[float, float]:
    """Returns `(summed raw layer seconds, cast seconds)` of a uniform `dtype` plan."""
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


def attribute_step_overhead(table: CostTable, measured: Mapping[str, float]) -> None:
    """Makes each measured uniform step's estimate equal its measurement, in place."""
    parts = {dtype: _uniform_step_parts(table, dtype) for dtype in measured}
    parts = {dtype: part for dtype, part in parts.items() if math.isfinite(part[0])}
    if not parts:
        return
    residuals = [measured[dtype] - layers - casts for dtype, (layers, casts) in parts.items()]
    overhead = max(0.0, min(residuals))
    scales = {
        dtype: (
            max((measured[dtype] - casts - overhead) / layers, MIN_TIME_SCALE)
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
