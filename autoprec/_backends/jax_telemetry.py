"""JAX side of the guard's telemetry: the whole frame is built inside the pure train step."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np
from keras import ops

from .telemetry import StepRecorder
from .telemetry_hooks import TelemetryHooksBase, advance_history, cleared_status


def bitcast(tensor: Any, dtype: str) -> jax.Array:
    """Returns `tensor`'s bits read as `dtype` of the same width, with `lax.bitcast_convert_type`."""
    return jax.lax.bitcast_convert_type(jnp.asarray(tensor), jnp.dtype(dtype))


def every_replica(flag: Any) -> Any:
    """Returns `flag` itself: a JAX step computes on the global batch, so a flag is already global."""
    return flag


def host_callback(function: Callable[..., None], *values: Any) -> None:
    """Calls `function` once on the host with `values` as NumPy arrays, from inside a compiled step."""
    jax.debug.callback(function, *values, ordered=False)


def carrier_identity(
    index: int, measure: Callable[[Any], Any]
) -> Callable[[Any, Any], tuple[Any, Any]]:
    """Returns an identity of `(value, carrier)` whose gradient records the amax of `value`'s."""

    @jax.custom_vjp
    def identity(value, carrier):
        return value, carrier

    def forward(value, carrier):
        return (value, carrier), None

    def backward(_, cotangents):
        upstream, carried = cotangents
        bits = bitcast(carried, "int32").at[index].max(measure(upstream))
        return upstream, bitcast(bits, "float32")

    identity.defvjp(forward, backward)
    return identity


class _StepState:
    """What the hooks carry while one train step is traced (the carrier and what it reached)."""

    def __init__(self, trace: Any, carrier: Any) -> None:
        self.trace = trace
        self.carrier = carrier
        self.watched: set[int] = set()
        self.forward: list[int] | None = None  # the frame segments of the forward values
        self.in_loss = False


class TelemetryHooks(TelemetryHooksBase):
    """The telemetry's state and step wrappers on JAX: the frame leaves the pure step for the host."""

    #: JAX measures every step: XLA fuses the reductions into the layers' own loops.
    measures_bfloat16_lazily = False

    def __init__(self, history: np.ndarray) -> None:
        self._history = np.array(history, np.float32)
        self._layers = int(self._history.shape[1]) - 1
        self._count = 0
        self._status = cleared_status()
        self._lock = threading.Lock()
        self._step: _StepState | None = None  # the train step being traced

    def integer_amax_is_fast(self, xla: bool) -> bool:
        """Returns `True`: JAX compiles with XLA, which reduces 16-bit integers on every device."""
        del xla
        return True

    def step_wrappers(
        self, model: keras.Model, recorder: StepRecorder, owners: Mapping[int, int]
    ) -> list[tuple[object, str, Callable]]:
        """Returns the wrappers of the JAX trainer's pure train step, its loss function and
        `stateless_apply`."""
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
        return [
            (model, "train_step", self._wrap_train_step(model, recorder, scale_position)),
            (model, "compute_loss_and_updates", self._wrap_loss(model, recorder)),
            (
                optimizer,
                "stateless_apply",
                self._wrap_stateless_apply(optimizer.stateless_apply, recorder, positions),
            ),
        ]

    def watch_gradient(self, recorder: StepRecorder, trace: Any, index: int, value: Any) -> Any:
        """Returns `value` through the carrier's identity (as is outside the loss function)."""
        step = self._step
        if step is None or step.trace is not trace or not step.in_loss:
            return value  # not differentiated through this step's carrier
        identity = carrier_identity(index, functools.partial(recorder.measure, trace))
        value, step.carrier = identity(value, step.carrier)
        step.watched.add(index)
        return value

    def _wrap_train_step(
        self, model: keras.Model, recorder: StepRecorder, scale_position: int | None
    ) -> Callable:
        original = model.train_step

        @functools.wraps(original)
        def train_step(state, data):
            trace = recorder.begin_step(data)
            trainable, non_trainable, optimizer_state, metrics = state
            step = _StepState(trace, jnp.zeros((self._layers,), jnp.float32))
            self._step = step
            try:
                scale = (
                    ops.cast(optimizer_state[scale_position], "float32")
                    if scale_position is not None
                    else ops.convert_to_tensor(1.0, "float32")
                )
                carried = ([*trainable, step.carrier], non_trainable, optimizer_state, metrics)
                logs, state = original(carried, data)
            finally:
                self._step = None
                recorder.end_step()
            extra = None
            if step.forward is not None:  # the loss function passed the forward values out
                trainable, non_trainable, optimizer_state, metrics = state
                extra = (non_trainable[-1], step.forward)
                state = (trainable, list(non_trainable[:-1]), optimizer_state, metrics)
            frame = recorder.frame(trace, scale, extra)
            host_callback(functools.partial(self._host_write, recorder), frame)
            return logs, state

        return train_step

    def _wrap_loss(self, model: keras.Model, recorder: StepRecorder) -> Callable:
        """The loss function takes the carrier off its inputs and passes the forward values out."""
        original = model.compute_loss_and_updates
        hooks = self

        @functools.wraps(original)
        def compute_loss_and_updates(trainable_variables, *args, **kwargs):
            step = hooks._step
            if step is None or step.trace is not recorder.active_step() or step.in_loss:
                return original(trainable_variables, *args, **kwargs)
            *trainable, step.carrier = trainable_variables
            step.in_loss = True
            try:
                loss, (unscaled, y_pred, non_trainable, metrics) = original(
                    trainable, *args, **kwargs
                )
            finally:
                step.in_loss = False
            packed, segments = recorder.take_forward_values(step.trace)
            step.forward = segments
            return loss, (unscaled, y_pred, [*non_trainable, packed], metrics)

        return compute_loss_and_updates

    def _wrap_stateless_apply(
        self, original: Callable, recorder: StepRecorder, positions: Mapping[int, int]
    ) -> Callable:
        """Takes the carrier's gradient off, records it and the weight gradients, then applies."""
        hooks = self

        @functools.wraps(original)
        def stateless_apply(optimizer_variables, grads, trainable_variables):
            step = hooks._step
            trace = recorder.active_step()
            if step is None or step.trace is not trace:
                return original(optimizer_variables, grads, trainable_variables)
            *grads, carried = grads
            *trainable_variables, _ = trainable_variables
            if step.watched:
                bits = bitcast(carried, "int32")
                for index in sorted(step.watched):
                    recorder.record_activation_gradient(trace, index, bits[index])
            for position, gradient in enumerate(grads):
                if gradient is not None:
                    recorder.record_weight_gradient(trace, positions.get(position), gradient)
            return original(optimizer_variables, grads, trainable_variables)

        return stateless_apply

    def _host_write(self, recorder: StepRecorder, frame: np.ndarray) -> None:
        """The host side of one step: the same history and status updates as TensorFlow's."""
        frame = np.array(frame, np.float32)
        with self._lock:
            self._history, status = advance_history(
                recorder, frame, self._history, self._status, np
            )
            self._status = status.astype(np.int32)
            self._count += 1

    @contextlib.contextmanager
    def _settled(self) -> Iterator[None]:
        """Holds the host state once every host callback of the steps run so far has run."""
        jax.effects_barrier()
        with self._lock:
            yield

    def read_history(self) -> np.ndarray:
        """Returns the history once every host callback of the steps run so far has run."""
        with self._settled():
            return np.array(self._history)

    def read_count(self) -> int:
        """Returns how many steps were recorded."""
        with self._settled():
            return int(self._count)

    def read_status(self) -> np.ndarray:
        """Returns `[failed, near_range]` since the last clear."""
        with self._settled():
            return np.array(self._status)

    def clear_status(self) -> None:
        """Resets the status (waiting for the callbacks still to run)."""
        with self._settled():
            self._status = cleared_status()
