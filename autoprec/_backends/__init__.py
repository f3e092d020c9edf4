"""Backend-specific parts of autoprec, one small module per Keras backend.

Two things need one: the profiler's in-graph probes (custom-gradient identities
and statistic variables, TensorFlow only) and the compiled functions that
`autoprec.cost.calibrate` times (TensorFlow and JAX). Every other module uses
Keras APIs and runs on any backend.
"""

from __future__ import annotations

from types import ModuleType

import keras

from ..errors import BackendError


def profiler_backend(feature: str = "autoprec.profile") -> ModuleType:
    """Returns the profiler backend module for the active Keras backend, imported lazily.

    Args:
        feature: what needs the backend, named in the error message.

    Returns:
        The backend module (`autoprec._backends.tensorflow`).

    Raises:
        BackendError: if the active Keras backend has no profiler backend.
    """
    name = keras.backend.backend()
    if name != "tensorflow":
        raise BackendError(
            f"{feature} records statistics with in-graph probes that exist only for the "
            f"TensorFlow backend; the active Keras backend is {name!r}. Set "
            "KERAS_BACKEND=tensorflow before importing keras, or profile the model in a "
            "TensorFlow process and load the saved profile with autoprec.Profile.load(path)."
        )
    from . import tensorflow as tensorflow_backend

    return tensorflow_backend


def telemetry_backend(feature: str = "the autoprec guard's telemetry") -> ModuleType:
    """Returns the module holding the guard telemetry's state on the active Keras backend.

    TensorFlow keeps the telemetry in per-replica device variables; JAX, whose
    train step is a pure function, sends each step's values to the host.

    Args:
        feature: what needs the backend, named in the error message.

    Returns:
        The backend module (`replica_local_variable`, `replica_values`,
        `assign_every_replica`, `integer_amax_is_fast`; JAX's also `host_callback`).

    Raises:
        BackendError: on a Keras backend other than TensorFlow and JAX.
    """
    if keras.backend.backend() == "jax":
        from . import jax as jax_backend

        return jax_backend
    return profiler_backend(feature)


def timing_backend(what: str, supported: tuple[str, ...] = ("tensorflow", "jax")) -> ModuleType:
    """Returns the module that builds timed functions on the active Keras backend, imported lazily.

    The module provides `versions()`, `to_device(value)`, `random_tensor(shape,
    dtype, rng)`, `layer_step(layer, args, kwargs, jit_compile)`, `empty_step()`
    and `cast_step(dtype, elements)`.

    Args:
        what: what needs the timing, named in the error message.
        supported: the backends that have a timing module.

    Raises:
        BackendError: naming the supported backends, on any other backend.
    """
    name = keras.backend.backend()
    if name == "tensorflow":
        from . import tensorflow as tensorflow_backend

        return tensorflow_backend
    if name == "jax":
        from . import jax as jax_backend

        return jax_backend
    raise BackendError(
        f"{what} measures on the {' and '.join(supported)} Keras backends; the "
        f"active Keras backend is {name!r}. Set KERAS_BACKEND=jax (or tensorflow) before "
        "importing keras, or use predict_costs() with a hardware profile instead."
    )
