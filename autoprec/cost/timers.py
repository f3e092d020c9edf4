"""Timing one thing on the active backend: a layer alone, a cast, an empty compiled call."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType

import keras
import numpy as np

from .._backends import timing_backend
from .._core.dtypes import policy_name
from .._core.timing import time_interleaved
from .layer_calls import LayerCall, synthetic_arguments

#: Keras backends `calibrate` and `measure_train_steps` can time on.
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


def _median_seconds(function: Callable[[], object], repeats: int) -> float:
    """Returns the median seconds of `repeats` calls of `function`, after two warm-up calls."""
    timings = time_interleaved(
        {"function": function},
        rounds=repeats,
        warmup=2,
        slow_seconds=SLOW_SECONDS,
        slow_rounds=SLOW_ROUNDS,
    )
    return timings["function"].median


def rebuild_layer(layer: keras.layers.Layer, dtype: str) -> keras.layers.Layer:
    """Returns an unbuilt copy of `layer` from its config, with the Keras policy of `dtype`."""
    config = layer.get_config()
    config["dtype"] = policy_name(dtype)
    config.pop("name", None)
    return layer.__class__.from_config(config)


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
    rng = np.random.default_rng(0)
    clone = rebuild_layer(layer, dtype)
    compute = keras.backend.standardize_dtype(clone.compute_dtype)
    args, kwargs = synthetic_arguments(call, batch_size, compute, rng)
    if "training" in inspect.signature(clone.call).parameters:
        kwargs["training"] = True
    return _median_seconds(timing.layer_step(clone, args, kwargs, jit_compile), repeats)


def time_empty_function(repeats: int) -> float:
    """Times a compiled function doing one trivial op: the per-call dispatch overhead."""
    timing = measuring_backend("calibrate()")
    return _median_seconds(timing.empty_step(), max(repeats, 9))


def time_cast(dtype: str, elements: int, repeats: int) -> float:
    """Times one cast of `elements` values between float32 and `dtype` (half a round trip)."""
    timing = measuring_backend("calibrate()")
    return _median_seconds(timing.cast_step(dtype, elements), repeats) / 2.0
