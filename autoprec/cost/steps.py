"""Whole training steps of model copies (uniform or per-layer policies) timed through `_core.timing`,
and what they correct in a table; a layer alone, a cast and an empty compiled call timed too."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import keras
import numpy as np

from .._backends import timing_backend
from .._core.data import batch_size_of, flat_arrays, input_part, slice_batch, target_part
from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT32, canonical_dtype, policy_name
from .._core.models import call_model_code, fresh_optimizer
from .._core.timing import Timing, time_interleaved
from ..errors import BackendError, PlanError
from ..hardware import FAST, HardwareProfile
from ..layers import layer_paths
from .layer_calls import LayerCall, synthetic_arguments
from .table import NOT_TIMED, STEPS_NOT_TIMED, CostTable, MeasurementCache, model_signature

#: Keras backends `calibrate` and `time_train_steps` can time on.
MEASURING_BACKENDS = ("tensorflow", "jax")

#: A timed function whose step takes over this many seconds is timed `SLOW_ROUNDS` times.
SLOW_SECONDS = 0.5
#: Timed calls of a function slower than `SLOW_SECONDS`.
SLOW_ROUNDS = 2


def measuring_backend(what: str) -> ModuleType:
    """Returns the active backend's timing module, or raises naming `what` needs it."""
    return timing_backend(what, MEASURING_BACKENDS)


def framework_versions() -> dict[str, str]:
    """Returns the Keras, backend and framework versions that key the cost cache."""
    versions = {"keras": keras.__version__, "backend": keras.backend.backend()}
    if keras.backend.backend() in MEASURING_BACKENDS:
        versions.update(measuring_backend("autoprec.cost").versions())
    return versions


#: `time_interleaved` with the slow-function rule of calibration.
_interleaved = functools.partial(
    time_interleaved, slow_seconds=SLOW_SECONDS, slow_rounds=SLOW_ROUNDS
)


def _median_seconds(function: Callable[[], object], repeats: int) -> float:
    """Returns the median seconds of `repeats` calls of `function`, after two warm-up calls."""
    return _interleaved({"function": function}, rounds=repeats, warmup=2)["function"].median


def _copied(copy: Callable[[], Any], name: str, lost: str, failure: str) -> Any:
    """Returns `copy()` run as the model's own code; `BackendError(failure)` if it fails."""
    clone = call_model_code(copy, layer=name, lost=lost, fallback=None)
    if clone is None:
        raise BackendError(failure)
    return clone


def rebuild_layer(layer: keras.layers.Layer, dtype: str, path: str = "") -> keras.layers.Layer:
    """Returns an unbuilt copy of `layer` from its config, with the Keras policy of `dtype`;
    raises `BackendError` (after one warning) when the layer's own code cannot rebuild it."""

    def rebuild() -> keras.layers.Layer:
        config = {**layer.get_config(), "dtype": policy_name(dtype)}
        config.pop("name", None)
        return layer.__class__.from_config(config)

    name = path or layer.name
    return _copied(
        rebuild, name, NOT_TIMED,
        f"layer {name!r} ({type(layer).__name__}) cannot be rebuilt from its get_config(); "
        "give it a get_config() that from_config() accepts to have it timed.",
    )  # fmt: skip


def time_layer(
    layer: keras.layers.Layer,
    call: LayerCall,
    dtype: str,
    batch_size: int,
    repeats: int,
    jit_compile: bool,
) -> float:
    """Times a standalone copy of `layer` forward+backward in `dtype` on random inputs."""
    timing = measuring_backend("calibrate()")
    clone = rebuild_layer(layer, dtype, call.path)
    compute = keras.backend.standardize_dtype(clone.compute_dtype)
    args, kwargs = synthetic_arguments(call, batch_size, compute, np.random.default_rng(0))
    if "training" in inspect.signature(clone.call).parameters:
        kwargs["training"] = True
    return _median_seconds(timing.layer_step(clone, args, kwargs, jit_compile), repeats)


def time_empty_function(repeats: int) -> float:
    """Times a compiled function doing one trivial op: the per-call dispatch overhead."""
    return _median_seconds(measuring_backend("calibrate()").empty_step(), max(repeats, 9))


def time_cast(dtype: str, elements: int, repeats: int) -> float:
    """Times one cast of `elements` values between float32 and `dtype` (half a round trip)."""
    cast = measuring_backend("calibrate()").cast_step(dtype, elements)
    return _median_seconds(cast, repeats) / 2.0


def clone_with_uniform_policy(model: keras.Model, dtype: str) -> keras.Model:
    """Returns a copy of `model` (fresh weights, compiled as it was) with every layer in `dtype`
    (float8: `Dense`/`EinsumDense` only, the rest in bfloat16); layers that refuse a policy keep theirs."""
    dtype = canonical_dtype(dtype, "clone_with_uniform_policy")
    clone = _clone(model)
    for layer in layer_paths(clone).values():
        _set_policy(layer, dtype)
    return clone


def _clone(model: keras.Model) -> keras.Model:
    """Returns `keras.models.clone_model(model)`; `BackendError` (after one warning) if it fails."""
    return _copied(
        lambda: keras.models.clone_model(model), model.name, STEPS_NOT_TIMED,
        f"model {model.name!r} cannot be copied by keras.models.clone_model.",
    )  # fmt: skip


def _set_policy(layer: keras.layers.Layer, dtype: str) -> None:
    if dtype == FLOAT8 and not isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
        dtype = BFLOAT16  # float8's source: a layer without a float8 path computes in it
    with contextlib.suppress(Exception):  # a layer that refuses a policy keeps its own
        layer.dtype_policy = policy_name(dtype)


def clone_with_policies(model: keras.Model, dtypes: Mapping[str, str]) -> keras.Model:
    """Returns a copy of `model` (fresh weights) with each named layer in its dtype."""
    names = {
        path: canonical_dtype(dtype, f"clone_with_policies[{path!r}]")
        for path, dtype in dtypes.items()
    }
    clone = _clone(model)
    paths = layer_paths(clone)
    missing = sorted(set(names) - set(paths))
    if missing:
        raise PlanError(
            f"clone_with_policies: {', '.join(repr(path) for path in missing[:5])} is not a "
            f"layer of model {model.name!r}; name layers by their "
            "autoprec.layers.layer_paths(model) paths."
        )
    for path, dtype in names.items():
        _set_policy(paths[path], dtype)
    return clone


#: Smallest per-dtype layer-time scale (guards against a step measured absurdly fast).
MIN_TIME_SCALE = 0.05

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
    inputs, targets = input_part(batch), target_part(batch)
    uniform = isinstance(plan, str)
    clone = clone_with_uniform_policy(model, plan) if uniform else clone_with_policies(model, plan)
    loss = getattr(model, "loss", None) if targets is not None else None
    if targets is None or loss is None:
        targets = _random_targets(clone, inputs)
        loss = "mse"
    optimizer = fresh_optimizer(getattr(model, "optimizer", None))
    if any(canonical_dtype(dtype) == "float16" for dtype in ([plan] if uniform else plan.values())):
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    clone.compile(optimizer=optimizer, loss=loss, jit_compile=jit_compile)
    # On JAX the batch goes to the device once, as a prefetching input pipeline would.
    inputs, targets = measuring_backend("time_train_steps()").to_device((inputs, targets))
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
    """Returns `{dtype or plan name: Timing}` of whole training steps of copies of `model`, each
    uniform in a dtype or under a named plan, timed in interleaved rounds."""
    measuring_backend("time_train_steps()")
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
    return _interleaved(functions, rounds=repeats, warmup=warmup)


def whole_step_dtypes(
    requested: bool | str | Sequence[str],
    dtypes: Sequence[str],
    profile: HardwareProfile,
) -> list[str]:
    """Returns the dtypes whose uniform whole step `calibrate` times, float32 first; float8's
    never (a float8 clone computes its other layers in bfloat16)."""
    dtypes = [dtype for dtype in dtypes if dtype != FLOAT8]
    if requested is False or requested is None:
        return []
    keyword = requested.strip().lower() if isinstance(requested, str) else None
    if requested is True or keyword == "all":
        return list(dtypes)
    if keyword == "fast":
        return [dtype for dtype in dtypes if profile.support(dtype) == FAST]
    names = [requested] if isinstance(requested, str) else list(requested)
    chosen = {canonical_dtype(name, "measure_model_step") for name in names} - {FLOAT8}
    missing = sorted(chosen - set(dtypes))
    if missing:
        raise PlanError(
            f"measure_model_step names {', '.join(missing)}, which calibrate() does not time "
            f"per layer (dtypes={list(dtypes)}); add it to dtypes, or pass True, 'fast' or False."
        )
    return [dtype for dtype in dtypes if dtype in chosen]


def _fast_steps(
    dtypes: Sequence[str], plans: Mapping[str, Mapping[str, str]], profile: HardwareProfile
) -> list[str]:
    """Returns the uniform dtypes and the mixed plans whose every dtype is fast here."""
    return [dtype for dtype in dtypes if profile.support(dtype) == FAST] + [
        name
        for name, assignment in plans.items()
        if all(profile.support(canonical_dtype(dtype)) == FAST for dtype in assignment.values())
    ]


def measure_whole_steps(
    model: keras.Model,
    batch: Any,
    dtypes: Sequence[str],
    profile: HardwareProfile,
    *,
    cache: MeasurementCache,
    repeats: int,
    jit_compile: bool,
    stats: dict[str, int],
    plans: Mapping[str, Mapping[str, str]] | None = None,
) -> tuple[dict[str, float], dict[str, float], float | None]:
    """Returns `(uniform, mixed, noise)`: whole steps timed or cached; none if the model cannot
    be copied."""
    stats.update({"model_step": 0, "model_steps_timed": 0, "mixed_step": 0, "mixed_steps_timed": 0})
    plans = dict(plans or {})
    payloads: dict[str, dict[str, Any]] = {dtype: {"dtype": dtype} for dtype in dtypes}
    for name, assignment in plans.items():
        payloads[name] = {"plan": name, "dtypes": sorted(assignment.items())}
    shapes = [list(array.shape) for array in flat_arrays(batch)]
    signature = model_signature(model)
    keys = {
        name: tuple(
            cache.key({"model_step": signature, "shapes": shapes, "jit": jit_compile, **extra})
            for extra in (payload, {**payload, "spread": True})
        )
        for name, payload in payloads.items()
    }
    measured = {name: cache.get(key) for name, (key, _) in keys.items()}
    spreads = {name: cache.get(key) for name, (_, key) in keys.items()}
    fast = _fast_steps(dtypes, plans, profile)
    # The second warm-up step, past tracing, tells whether a step is slow.
    groups = [fast] if any(measured[name] is None for name in fast) else []
    groups += [[name] for name in payloads if name not in fast and measured[name] is None]
    for group in groups:
        mixed = {name: plans[name] for name in group if name in plans}
        uniform = [name for name in group if name in dtypes]
        try:
            timed = time_train_steps(
                model, batch, uniform, max(repeats, 3), jit_compile, 2, plans=mixed
            )
        except Exception:  # noqa: BLE001 - subclassed models cannot be cloned: no correction
            return {}, {}, None
        for name in group:
            if name not in timed:  # a mixed plan that cannot run
                cache.put(keys[name][0], 0.0, f"whole {name} train step: does not run")
                measured[name] = 0.0
                continue
            measured[name], spreads[name] = timed[name].median, timed[name].spread
            cache.put(keys[name][0], measured[name], f"whole {name} train step")
            if spreads[name] is not None:
                cache.put(keys[name][1], spreads[name], f"whole {name} step: spread of its rounds")
            stats["mixed_steps_timed" if name in plans else "model_steps_timed"] += 1
    known = {name: seconds for name, seconds in measured.items() if seconds}
    ratios = [
        spreads[name] / seconds for name, seconds in known.items() if spreads[name] is not None
    ]
    uniform_steps = {name: seconds for name, seconds in known.items() if name in dtypes}
    mixed_steps = {name: seconds for name, seconds in known.items() if name in plans}
    stats["model_step"], stats["mixed_step"] = len(uniform_steps), len(mixed_steps)
    return uniform_steps, mixed_steps, (float(np.median(ratios)) if ratios else None)


def attribute_step_overhead(table: CostTable, measured: Mapping[str, float]) -> None:
    """Makes each measured uniform step's estimate equal its measurement, in place."""
    inputs = [
        elements * table.batch_size for producer, _, elements in table.edges if producer is None
    ]
    parts: dict[str, tuple[float, float]] = {}  # dtype: (summed raw layer seconds, cast seconds)
    for dtype in measured:
        seconds = [record.seconds.get(dtype) for record in table.layers.values()]
        casts = [table.cast_cost(elements, dtype) for elements in inputs if dtype != FLOAT32]
        if None not in seconds and math.isfinite(sum(seconds)):
            parts[dtype] = (sum(seconds), sum(casts))
    if not parts:
        return
    residuals = [measured[dtype] - layers - casts for dtype, (layers, casts) in parts.items()]
    overhead = max(0.0, min(residuals))
    scales = {
        dtype: max((measured[dtype] - casts - overhead) / layers, MIN_TIME_SCALE) if layers else 1.0
        for dtype, (layers, casts) in parts.items()
    }
    table.step_overhead_seconds = overhead
    table.layer_time_scale = scales.get(FLOAT32, 1.0)
    table.layer_time_scale_by_dtype = scales
    table.measured_step_seconds = measured.get(FLOAT32)
    table.measured_step_seconds_by_dtype = {dtype: float(measured[dtype]) for dtype in parts}
