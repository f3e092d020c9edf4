"""Backend-specific parts of autoprec, one small module per Keras backend and job."""

from __future__ import annotations

from types import ModuleType

import keras

from ..errors import BackendError


def profiler_backend(feature: str = "autoprec.profile") -> ModuleType:
    """Returns the profiler backend module for the active Keras backend, imported lazily."""
    name = keras.backend.backend()
    if name == "tensorflow":
        from . import tensorflow as tensorflow_backend

        return tensorflow_backend
    if name == "jax":
        from . import jax_probes

        return jax_probes
    raise BackendError(
        f"{feature} records statistics with probes inside the train step, which exist for "
        f"the TensorFlow and JAX Keras backends; the active Keras backend is {name!r}. Set "
        "KERAS_BACKEND=tensorflow (or jax) before importing keras, or profile the model in "
        "such a process and load the saved profile with autoprec.Profile.load(path)."
    )


def telemetry_backend(feature: str = "the autoprec guard's telemetry") -> ModuleType:
    """Returns the guard telemetry's backend module for the active Keras backend, imported lazily."""
    name = keras.backend.backend()
    if name == "tensorflow":
        from . import tensorflow_telemetry

        return tensorflow_telemetry
    if name == "jax":
        from . import jax_telemetry

        return jax_telemetry
    raise BackendError(
        f"{feature} records inside the compiled train step on the TensorFlow and JAX "
        f"Keras backends; the active Keras backend is {name!r}. Set KERAS_BACKEND=tensorflow "
        "(or jax) before importing keras, or train with guard=None."
    )


def timing_backend(what: str, supported: tuple[str, ...] = ("tensorflow", "jax")) -> ModuleType:
    """Returns the module that builds timed functions on the active Keras backend, imported lazily."""
    name = keras.backend.backend()
    if name == "tensorflow":
        from . import tensorflow_timing

        return tensorflow_timing
    if name == "jax":
        from . import jax_timing

        return jax_timing
    raise BackendError(
        f"{what} measures on the {' and '.join(supported)} Keras backends; the "
        f"active Keras backend is {name!r}. Set KERAS_BACKEND=jax (or tensorflow) before "
        "importing keras, or use predict_costs() with a hardware profile instead."
    )
