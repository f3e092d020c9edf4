"""Backend-specific parts of autoprec, one module per Keras backend (`tensorflow`, `jax`): the in-step
instrumentation, the same interface on each (`ProbeHooks`, `is_float_tensor`, `xla_can_host_probes`,
`every_replica`; types in `instrument.py`), and the compiled steps timing measures."""

from __future__ import annotations

from types import ModuleType

import keras

from ..errors import BackendError

#: What a feature that records inside the train step says on another backend.
PROFILER_UNSUPPORTED = (
    "{feature} records statistics with probes inside the train step, which exist for "
    "the TensorFlow and JAX Keras backends; the active Keras backend is {name!r}. Set "
    "KERAS_BACKEND=tensorflow (or jax) before importing keras, or profile the model in "
    "such a process and load the saved profile with autoprec.Profile.load(path)."
)
TELEMETRY_UNSUPPORTED = (
    "{feature} records inside the compiled train step on the TensorFlow and JAX "
    "Keras backends; the active Keras backend is {name!r}. Set KERAS_BACKEND=tensorflow "
    "(or jax) before importing keras, or train with guard=None."
)


def instrument_backend(
    feature: str = "the autoprec guard", unsupported: str = TELEMETRY_UNSUPPORTED
) -> ModuleType:
    """Returns the in-step instrumentation module of the active Keras backend, imported lazily."""
    name = keras.backend.backend()
    if name == "tensorflow":
        from . import tensorflow as tensorflow_backend

        return tensorflow_backend
    if name == "jax":
        from . import jax as jax_backend

        return jax_backend
    raise BackendError(unsupported.format(feature=feature, name=name))


def timing_backend(what: str, supported: tuple[str, ...] = ("tensorflow", "jax")) -> ModuleType:
    """Returns the module that builds timed functions on the active Keras backend, imported lazily."""
    return instrument_backend(
        what,
        f"{{feature}} measures on the {' and '.join(supported)} Keras backends; the active Keras "
        "backend is {name!r}. Set KERAS_BACKEND=jax (or tensorflow) before importing keras, or use "
        "predict_costs() with a hardware profile instead.",
    )
