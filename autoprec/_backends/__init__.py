"""Backend-specific parts of autoprec, one small module per Keras backend and job.

Three things need one, each chosen here once for the active Keras backend:

- the profiler's in-step probes, behind the one interface of
  `autoprec._backends.probe_hooks`: `tensorflow` (custom-gradient identities
  and statistic variables) and `jax_probes` (statistics returned with each
  pure train step's logs, through the sinks of `jax_sinks`), each tensor
  measured by `tensorflow_statistics` or `jax_statistics`, and TensorBoard
  files written by `tensorflow_tensorboard`;
- the compiled functions that `autoprec.cost.calibrate` times:
  `tensorflow_timing` and `jax_timing`, with the same names;
- the guard telemetry's state and step hooks: `tensorflow_telemetry` and
  `jax_telemetry`, behind the one interface of `autoprec._backends.telemetry`
  (the amax maths they share is `amax`, written with `keras.ops`; what their
  hooks share is `telemetry_hooks`).

Every other module uses Keras APIs and runs on any backend.
"""

from __future__ import annotations

from types import ModuleType

import keras

from ..errors import BackendError


def profiler_backend(feature: str = "autoprec.profile") -> ModuleType:
    """Returns the profiler backend module for the active Keras backend, imported lazily.

    Both modules provide `ProbeHooks(xla)` (the `autoprec._backends.probe_hooks.
    ProbeHooks` protocol), `is_float_tensor`, `xla_can_host_probes` and
    `write_histograms`.

    Args:
        feature: what needs the backend, named in the error message.

    Returns:
        `autoprec._backends.tensorflow` or `autoprec._backends.jax_probes`.

    Raises:
        BackendError: on a Keras backend other than TensorFlow and JAX.

    Example:

    ```python
    hooks = profiler_backend().ProbeHooks(xla=False)
    ```
    """
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
    """Returns the guard telemetry's backend module for the active Keras backend, imported lazily.

    TensorFlow keeps the telemetry in per-replica device variables; JAX, whose
    train step is a pure function, sends each step's values to the host. Both
    modules provide `TelemetryHooks(history)` (the `autoprec._backends.telemetry.
    TelemetryHooks` protocol) and `bitcast(tensor, dtype)`.

    Args:
        feature: what needs the backend, named in the error message.

    Returns:
        `autoprec._backends.tensorflow_telemetry` or `autoprec._backends.jax_telemetry`.

    Raises:
        BackendError: on a Keras backend other than TensorFlow and JAX.

    Example:

    ```python
    hooks = telemetry_backend().TelemetryHooks(np.full((16, 3, 4), -1.0, np.float32))
    ```
    """
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
