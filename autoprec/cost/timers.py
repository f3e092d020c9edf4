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
from .._core.dtypes import policy_name
from .._core.timing import time_interleaved
from .synthetic import synthetic_arguments
from .trace import LayerCall

#: Keras backends `calibrate` and `measure_train_steps` can time on.
MEASURING_BACKENDS = ("tensorflow", "jax")

#: A timed function whose step takes over this many seconds is timed `SLOW_ROUNDS` times.
SLOW_SECONDS = 0.5
#: Timed calls of a function slower than `SLOW_SECONDS`.
SLOW_ROUNDS = 2


def measuring_backend(what: str) -> ModuleType:
    """Returns the active backend's timing module, or raises naming `what` needs it.

    Args:
        what: the function that needs to time, named in the error.

    Returns:
        `autoprec._backends.tensorflow` or `autoprec._backends.jax`.

    Raises:
        BackendError: on a Keras backend other than TensorFlow or JAX.

    Example:

    ```python
    backend = measuring_backend("calibrate()")
    backend.versions()["tensorflow"]
    ```
    """
    return timing_backend(what, MEASURING_BACKENDS)


def framework_versions() -> dict[str, str]:
    """Returns the Keras, backend and framework versions that key the cost cache.

    Returns:
        `{"keras": ..., "backend": ...}`, plus the framework's own versions on a
        backend that can time.

    Example:

    ```python
    framework_versions()["backend"]  # "tensorflow"
    ```
    """
    versions = {"keras": keras.__version__, "backend": keras.backend.backend()}
    if keras.backend.backend() in MEASURING_BACKENDS:
        versions.update(measuring_backend("autoprec.cost").versions())
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
        slow_seconds=SLOW_SECONDS,
        slow_rounds=SLOW_ROUNDS,
    )
    return timings["function"].median


def rebuild_layer(layer: keras.layers.Layer, dtype: str) -> keras.layers.Layer:
    """Returns an unbuilt copy of `layer` from its config, with the Keras policy of `dtype`.

    Args:
        layer: the layer to copy (left untouched).
        dtype: a plan dtype; float8 gives `float8_from_mixed_bfloat16` (a `Dense`
            or `EinsumDense` with its scales and amax histories).

    Returns:
        The copy, named by Keras.

    Example:

    ```python
    rebuild_layer(keras.layers.Dense(16), "float8").dtype_policy.name
    # "float8_from_mixed_bfloat16"
    ```
    """
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
    """Times a standalone copy of `layer` forward+backward in `dtype` on random inputs.

    The copy is rebuilt from the layer's config with the dtype's policy
    (`policy_name`: `mixed_*`, or `float8_from_mixed_bfloat16` for float8,
    whose step includes the scale and amax-history updates) and called as
    `call` recorded, at `batch_size` samples.

    Args:
        layer: the layer to copy (left untouched).
        call: one recorded call of it (`trace_model(model).calls[path][0]`).
        dtype: the copy's plan dtype (float8 only for `Dense` and `EinsumDense`).
        batch_size: the leading dimension of every argument.
        repeats: timed calls (median), after two warm-up calls.
        jit_compile: whether to compile the step with XLA.

    Returns:
        Median seconds of one compiled forward+backward call.

    Raises:
        BackendError: on a backend that cannot time; any error of rebuilding
            or calling the copy is passed on.

    Example:

    ```python
    call = autoprec.cost.trace_model(model).calls["dense"][0]
    time_layer(layer_paths(model)["dense"], call, "float32", 32, 5, False)
    ```
    """
    timing = measuring_backend("calibrate()")
    rng = np.random.default_rng(0)
    clone = rebuild_layer(layer, dtype)
    compute = keras.backend.standardize_dtype(clone.compute_dtype)
    args, kwargs = synthetic_arguments(call, batch_size, compute, rng)
    if "training" in inspect.signature(clone.call).parameters:
        kwargs["training"] = True
    return _median_seconds(timing.layer_step(clone, args, kwargs, jit_compile), repeats)


def time_empty_function(repeats: int) -> float:
    """Times a compiled function doing one trivial op: the per-call dispatch overhead.

    Args:
        repeats: timed calls (median; at least 9).

    Returns:
        Median seconds of one call.

    Example:

    ```python
    time_empty_function(9)  # a few microseconds
    ```
    """
    timing = measuring_backend("calibrate()")
    return _median_seconds(timing.empty_step(), max(repeats, 9))


def time_cast(dtype: str, elements: int, repeats: int) -> float:
    """Times one cast of `elements` values between float32 and `dtype` (half a round trip).

    Args:
        dtype: the 16-bit dtype cast to and from.
        elements: values cast.
        repeats: timed round trips (median).

    Returns:
        Seconds of one cast: half the median round trip.

    Example:

    ```python
    time_cast("bfloat16", 1 << 20, 5)
    ```
    """
    timing = measuring_backend("calibrate()")
    return _median_seconds(timing.cast_step(dtype, elements), repeats) / 2.0
