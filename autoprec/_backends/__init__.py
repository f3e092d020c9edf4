"""Backend-specific parts of autoprec, one small module per Keras backend.

Only the profiler needs one: its in-graph probes (custom-gradient identities
and statistic variables) are written against the backend's own API. Every
other module uses Keras APIs and runs on any backend.
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
