"""JAX side of the guard's telemetry: values leave the pure train step through host callbacks.

A JAX train step is a pure function: it cannot assign to a variable from
inside. The values the telemetry (a `StepRecorder`) records in the forward
pass leave the differentiated loss function as one extra entry of its
auxiliary outputs; the activation-gradient maxima (a gradient function is
traced on its own) and the step's frame leave the compiled step through
ordered host callbacks; the history, count and status live on the host, and
reading them waits for the callbacks (`jax.effects_barrier`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np
from keras import ops

from .telemetry import Replace, StepRecorder


def bitcast(tensor: Any, dtype: str) -> jax.Array:
    """Returns `tensor`'s bits read as `dtype` of the same width (`lax.bitcast_convert_type`).

    Args:
        tensor: an array.
        dtype: a dtype of the same item size, e.g. `"int16"` for float16.

    Returns:
        The array of `dtype`, same shape.

    Example:

    ```python
    bitcast(jnp.float32(1.0), "int32")  # 1065353216
    ```
    """
    return jax.lax.bitcast_convert_type(jnp.asarray(tensor), jnp.dtype(dtype))


def host_callback(function: Callable[..., None], *values: Any) -> None:
    """Calls `function` on the host with `values` as NumPy arrays, from inside a compiled step.

    The calls are ordered: they run in program order, the backward pass's
    before the end of the step's.

    Args:
        function: the host function.
        *values: arrays of the traced step.

    Example:

    ```python
    host_callback(print, amax_bits(gradient))
    ```
    """
    jax.debug.callback(function, *values, ordered=True)


def _nan_max(first: np.floating | None, second: np.floating) -> np.float32:
    """The larger of two amax values, NaN when either is (`None` counts as absent)."""
    if first is None:
        return np.float32(second)
    return np.float32(np.maximum(np.float32(first), np.float32(second)))


class TelemetryHooks:
    """The telemetry's state and step wrappers on JAX (see `autoprec._backends.telemetry`).

    Args:
        history: the history's first value, `[steps, rows, slots]` float32.

    Example:

    ```python
    hooks = TelemetryHooks(np.full((16, 3, 4), -1.0, np.float32))
    hooks.read_count()  # 0
    ```
    """

    #: JAX measures every step: XLA fuses the reductions into the layers' own loops.
    measures_bfloat16_lazily = False

    def __init__(self, history: np.ndarray) -> None:
        self._history = np.array(history, np.float32)
        self._count = 0
        self._status = np.zeros(2, np.int32)
        # Activation-gradient maxima by recorded layer, until their step's frame arrives.
        self._pending: dict[int, np.float32] = {}
        # The frame segments of the values the loss function passes out, per traced step.
        self._segments: list[int] = []

    def integer_amax_is_fast(self, xla: bool) -> bool:
        """Returns `True`: JAX compiles with XLA, which reduces 16-bit integers on every device."""
        del xla
        return True

    def install_step(
        self,
        model: keras.Model,
        recorder: StepRecorder,
        owners: Mapping[int, int],
        replace: Replace,
    ) -> None:
        """Wraps the JAX trainer's pure train step, its loss function and `stateless_apply`.

        Args:
            model: the compiled model.
            recorder: the telemetry.
            owners: `{id(variable): recorded layer index}` of the trainable weights.
            replace: sets a method for as long as the telemetry is installed.
        """
        optimizer = model.optimizer
        scale_position = None
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            scale_position = next(
                position
                for position, variable in enumerate(optimizer.variables)
                if variable is optimizer.dynamic_scale
            )
        positions = {
            position: owners[id(variable)]
            for position, variable in enumerate(model.trainable_variables)
            if id(variable) in owners
        }
        replace(model, "train_step", self._wrap_train_step(model, recorder, scale_position))
        replace(model, "compute_loss_and_updates", self._wrap_loss(model, recorder))
        replace(
            optimizer,
            "stateless_apply",
            _wrap_stateless_apply(optimizer.stateless_apply, recorder, positions),
        )

    def activation_gradient(
        self, recorder: StepRecorder, trace: Any, index: int, bits: Any
    ) -> None:
        """Sends the amax to the host: a JAX gradient function is traced apart from the step."""
        del recorder, trace
        host_callback(functools.partial(self._host_gradient, index), bits)

    def _wrap_train_step(
        self, model: keras.Model, recorder: StepRecorder, scale_position: int | None
    ) -> Callable:
        original = model.train_step

        @functools.wraps(original)
        def train_step(state, data):
            trace = recorder.begin_step(data)
            try:
                scale = (
                    ops.cast(state[2][scale_position], "float32")
                    if scale_position is not None
                    else ops.convert_to_tensor(1.0, "float32")
                )
                logs, state = original(state, data)
            finally:
                recorder.end_step()
            trainable, non_trainable, optimizer_state, metrics = state
            frame = recorder.frame(trace, scale, (non_trainable[-1], self._segments))
            host_callback(functools.partial(self._host_write, recorder), frame)
            return logs, (trainable, list(non_trainable[:-1]), optimizer_state, metrics)

        return train_step

    def _wrap_loss(self, model: keras.Model, recorder: StepRecorder) -> Callable:
        """The loss function passes the forward values out as one more non-trainable value."""
        original = model.compute_loss_and_updates

        @functools.wraps(original)
        def compute_loss_and_updates(*args, **kwargs):
            trace = recorder.active_step()
            if trace is None:  # not this telemetry's train step
                return original(*args, **kwargs)
            loss, (unscaled, y_pred, non_trainable, metrics) = original(*args, **kwargs)
            packed, self._segments = recorder.take_forward_values(trace)
            return loss, (unscaled, y_pred, [*non_trainable, packed], metrics)

        return compute_loss_and_updates

    def _host_gradient(self, index: int, bits: np.ndarray) -> None:
        """Keeps a float16 layer's activation-gradient amax until its step's frame arrives."""
        value = np.asarray(bits, np.int32).view(np.float32)
        self._pending[index] = _nan_max(self._pending.get(index), value)

    def _host_write(self, recorder: StepRecorder, frame: np.ndarray) -> None:
        """The host side of one step: the same history and status updates as TensorFlow's."""
        frame = recorder.merge_activation_gradients(np.array(frame, np.float32), self._pending)
        self._pending = {}
        failed, near = recorder.status_flags(frame, self._history, np)
        self._history = np.concatenate([self._history[1:], frame[None]], axis=0)
        self._count += 1
        self._status = np.maximum(self._status, np.array([failed, near], np.int32))

    def read_history(self) -> np.ndarray:
        """Returns the history once every host callback of the steps run so far has run."""
        jax.effects_barrier()
        return np.array(self._history)

    def read_count(self) -> int:
        """Returns how many steps were recorded."""
        jax.effects_barrier()
        return int(self._count)

    def read_status(self) -> np.ndarray:
        """Returns `[failed, near_range]` since the last clear."""
        jax.effects_barrier()
        return np.array(self._status)

    def clear_status(self) -> None:
        """Resets the status (waiting for the callbacks still to run)."""
        jax.effects_barrier()
        self._status = np.zeros(2, np.int32)


def _wrap_stateless_apply(
    original: Callable, recorder: StepRecorder, positions: Mapping[int, int]
) -> Callable:
    @functools.wraps(original)
    def stateless_apply(optimizer_variables, grads, trainable_variables):
        trace = recorder.active_step()
        if trace is not None:
            for position, gradient in enumerate(grads):
                if gradient is not None:
                    recorder.record_weight_gradient(trace, positions.get(position), gradient)
        return original(optimizer_variables, grads, trainable_variables)

    return stateless_apply
