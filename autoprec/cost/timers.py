"""Timing one thing on the active backend: a layer alone, a cast, an empty compiled call.

The backend modules (`autoprec._backends.tensorflow`, `autoprec._backends.jax`)
build the compiled functions; this module times them with the one interleaved
timer of `autoprec._core.timing`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType

import keras
import numpy as np

from .._backends import timing_backend
from .._core.dtypes import POLICY_FOR_DTYPE
from .._core.timing import time_interleaved
from .trace import LayerCall, synthetic_arguments

#: Keras backends `calibrate` and `measure_train_steps` can time on.
MEASURING_BACKENDS = ("tensorflow", "jax")

#: A timed function whose step takes over this many seconds is timed `_SLOW_ROUNDS` times.
_SLOW_SECONDS = 0.5
_SLOW_ROUNDS = 2


def _timing_backend(what: str) -> ModuleType:
    """Returns the active backend's timing module (see `autoprec._backends.timing_backend`)."""
    return timing_backend(what, MEASURING_BACKENDS)


def _framework_versions() -> dict[str, str]:
    """Returns the Keras, backend and framework versions that key the cost cache."""
    versions = {"keras": keras.__version__, "backend": keras.backend.backend()}
    if keras.backend.backend() in MEASURING_BACKENDS:
        versions.update(_timing_backend("autoprec.cost").versions())
    return versions


def _median_seconds(function: Callable[[], object], repeats: int) -> float:
    """Returns the median seconds of `repeats` calls of `function`, after two warm-up calls.

    The first warm-up call traces and compiles; the second tells whether a call
    is slow (over half a second), which is then timed twice only.
    """
    timings = time_interleaved(
        {"function": function},
        rounds=repeats,
        warmup=2,
        slow_seconds=_SLOW_SECONDS,
        slow_rounds=_SLOW_ROUNDS,
    )
    return timings["function"].median


def _rebuild_layer(layer: keras.layers.Layer, dtype: str) -> keras.layers.Layer:
    config = layer.get_config()
    config["dtype"] = POLICY_FOR_DTYPE[dtype]
    config.pop("name", None)
    return layer.__class__.from_config(config)


def _time_layer(
    layer: keras.layers.Layer,
    call: LayerCall,
    dtype: str,
    batch_size: int,
    repeats: int,
    jit_compile: bool,
) -> float:
    """Times a standalone copy of `layer` forward+backward in `dtype` on random inputs."""
    timing = _timing_backend("calibrate()")
    rng = np.random.default_rng(0)
    clone = _rebuild_layer(layer, dtype)
    compute = keras.backend.standardize_dtype(clone.compute_dtype)
    args, kwargs = synthetic_arguments(call, batch_size, compute, rng)
    if "training" in inspect.signature(clone.call).parameters:
        kwargs["training"] = True
    return _median_seconds(timing.layer_step(clone, args, kwargs, jit_compile), repeats)


def _time_empty_function(repeats: int) -> float:
    """Times a compiled function doing one trivial op: the per-call dispatch overhead."""
    timing = _timing_backend("calibrate()")
    return _median_seconds(timing.empty_step(), max(repeats, 9))


def _time_cast(dtype: str, elements: int, repeats: int) -> float:
    """Times one cast of `elements` values between float32 and `dtype` (half a round trip)."""
    timing = _timing_backend("calibrate()")
    return _median_seconds(timing.cast_step(dtype, elements), repeats) / 2.0
