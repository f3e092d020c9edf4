"""TensorFlow side of the guard's telemetry: per-replica variables updated inside the step."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from .telemetry import StepRecorder
from .telemetry_hooks import TelemetryHooksBase, advance_history, cleared_status
from .tensorflow import variable_name


def replica_local_variable(initial_value: np.ndarray, name: str) -> tf.Variable:
    """Returns a variable each replica updates on its own, created outside any trace."""
    with tf.init_scope():
        return tf.Variable(
            initial_value,
            trainable=False,
            name=variable_name(name, "telemetry"),
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM,
        )


def replica_values(variable: tf.Variable) -> list[np.ndarray]:
    """Returns the value of every replica's copy of `variable`, as NumPy arrays."""
    return [np.asarray(local.numpy()) for local in _local_copies(variable)]


def assign_every_replica(variable: tf.Variable, value: np.ndarray) -> None:
    """Sets every replica's copy of `variable` to `value` (from the host, between steps)."""
    for local in _local_copies(variable):
        local.assign(value)


def _local_copies(variable: tf.Variable) -> tuple:
    strategy = getattr(variable, "distribute_strategy", None) or tf.distribute.get_strategy()
    return tuple(strategy.experimental_local_results(variable))


def bitcast(tensor: Any, dtype: str) -> tf.Tensor:
    """Returns `tensor`'s bits read as `dtype` of the same width, with `tf.bitcast`, scalars
    included."""
    return tf.bitcast(tf.convert_to_tensor(tensor), tf.as_dtype(dtype))


def replicas_in_sync() -> int:
    """Returns how many replicas run the step being traced (1 outside a strategy)."""
    context = tf.distribute.get_replica_context()
    return 1 if context is None else int(context.num_replicas_in_sync)


def every_replica(flag: Any) -> tf.Tensor:
    """Returns whether `flag` holds on every replica (one all-reduce; `flag` itself on one replica)."""
    flag = tf.convert_to_tensor(flag, tf.bool)
    if replicas_in_sync() == 1:
        return flag
    failing = tf.cast(tf.logical_not(flag), tf.int32)
    context = tf.distribute.get_replica_context()
    return tf.equal(context.all_reduce(tf.distribute.ReduceOp.SUM, failing), 0)


def loss_scale(model: keras.Model) -> tf.Tensor:
    """Returns the loss scale the model's optimizer applies now, as a float32 scalar (1 without)."""
    optimizer = model.optimizer
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return ops.cast(ops.convert_to_tensor(optimizer.dynamic_scale), "float32")
    return ops.convert_to_tensor(1.0, "float32")


class TelemetryHooks(TelemetryHooksBase):
    """The telemetry's state and step wrappers on TensorFlow: per-replica variables written in the
    step."""

    #: bfloat16 layers are measured in a conditional branch that only failing steps take.
    measures_bfloat16_lazily = True

    def __init__(self, history: np.ndarray) -> None:
        self._history = replica_local_variable(history, "autoprec_guard_history")
        self._count = replica_local_variable(np.int64(0), "autoprec_guard_steps")
        self._status = replica_local_variable(cleared_status(), "autoprec_guard_status")

    def integer_amax_is_fast(self, xla: bool) -> bool:
        """Returns whether the amax may reduce bit patterns as 16/32-bit integers."""
        return xla or not tf.config.list_logical_devices("GPU")

    def step_wrappers(
        self, model: keras.Model, recorder: StepRecorder, owners: Mapping[int, int]
    ) -> list[tuple[object, str, Callable]]:
        """Returns the wrappers of `model.train_step` (frame written in the step) and
        `apply_gradients`."""
        optimizer = model.optimizer
        return [
            (model, "train_step", self._wrap_train_step(model, recorder)),
            (
                optimizer,
                "apply_gradients",
                _wrap_apply_gradients(optimizer.apply_gradients, recorder, owners),
            ),
        ]

    def watch_gradient(self, recorder: StepRecorder, trace: Any, index: int, value: Any) -> Any:
        """Returns `value` through a custom-gradient identity recording the gradient's amax."""

        @ops.custom_gradient
        def identity(value):
            def gradient(*args, upstream=None):
                if upstream is None:
                    (upstream,) = args
                current = recorder.active_step()
                if current is not None:
                    bits = recorder.measure(current, upstream)
                    recorder.record_activation_gradient(current, index, bits)
                return upstream

            return ops.copy(value), gradient

        return identity(value)

    def _wrap_train_step(self, model: keras.Model, recorder: StepRecorder) -> Callable:
        original = model.train_step

        @functools.wraps(original)
        def train_step(data):
            trace = recorder.begin_step(data)
            try:
                scale = loss_scale(model)
                outputs = original(data)
            finally:
                recorder.end_step()
            self._write(recorder, recorder.frame(trace, scale))
            return outputs

        return train_step

    def _write(self, recorder: StepRecorder, frame: Any) -> None:
        """Appends the step's frame to the history with one update; raises the status flags."""
        history, status = advance_history(
            recorder,
            frame,
            ops.convert_to_tensor(self._history),
            ops.convert_to_tensor(self._status),
            ops,
        )
        self._history.assign(history)
        self._count.assign_add(ops.convert_to_tensor(1, "int64"))
        self._status.assign(ops.cast(status, "int32"))

    def read_history(self) -> np.ndarray:
        """Returns the history, combined over replicas (the largest values)."""
        return _largest_replica_value(self._history)

    def read_count(self) -> int:
        """Returns how many steps were recorded (the largest replica count)."""
        return int(max(int(value) for value in replica_values(self._count)))

    def read_status(self) -> np.ndarray:
        """Returns `[failed, near_range]` since the last clear, combined over replicas."""
        return _largest_replica_value(self._status)

    def clear_status(self) -> None:
        """Resets every replica's status."""
        assign_every_replica(self._status, cleared_status())


def _largest_replica_value(variable: tf.Variable) -> np.ndarray:
    """The largest value of each element over every replica's copy of `variable`."""
    return np.max(np.stack(replica_values(variable)), axis=0)


def _wrap_apply_gradients(
    original: Callable, recorder: StepRecorder, owners: Mapping[int, int]
) -> Callable:
    @functools.wraps(original)
    def apply_gradients(grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        trace = recorder.active_step()
        if trace is not None:
            for gradient, variable in pairs:
                if gradient is not None:
                    recorder.record_weight_gradient(trace, owners.get(id(variable)), gradient)
            if replicas_in_sync() > 1:
                pairs = _skipped_on_every_replica(pairs, recorder.gradients_finite(trace))
        return original(pairs, *args, **kwargs)

    return apply_gradients


def _skipped_on_every_replica(pairs: list, finite: Any) -> list:
    """Makes the smallest dense gradient NaN on every replica when one replica's are not finite."""
    dense = [
        (index, gradient)
        for index, (gradient, _) in enumerate(pairs)
        if isinstance(gradient, tf.Tensor) and gradient.dtype.is_floating
    ]
    if not dense:
        return pairs
    index, gradient = min(dense, key=lambda item: item[1].shape.num_elements() or 0)
    globally = every_replica(finite)
    poison = tf.where(
        globally, tf.constant(0.0, gradient.dtype), tf.constant(np.nan, gradient.dtype)
    )
    pairs = list(pairs)
    pairs[index] = (gradient + poison, pairs[index][1])
    return pairs
