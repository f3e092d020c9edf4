"""TensorFlow side of the in-step instrumentation: statistic and telemetry variables updated inside
the traced step, one copy per replica."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from .instrument import advance_history, amax_bits, cleared_status
from .tensorflow_statistics import RAW_COUNT_SLOTS, combine_floats, tensor_statistics
from .tensorflow_tensorboard import write_histograms as write_histograms  # the interface's

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def variable_name(name: str, fallback: str) -> str:
    """Returns `name` made safe for a `tf.Variable` (odd characters as `_`, 120 at most)."""
    return _NAME_UNSAFE.sub("_", name)[:120] or fallback


class StatisticsCache:
    """Statistics already computed in one traced train step, by tensor."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[tf.Tensor, tf.Tensor]] = {}

    @staticmethod
    def _key(tensor: tf.Tensor, multiplier: tf.Tensor | None) -> tuple:
        return (tensor.ref(), None if multiplier is None else multiplier.ref())

    def statistics(
        self, tensor: tf.Tensor, xla: bool, multiplier: tf.Tensor | None
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """Returns the statistics of `tensor`, computing them on the first request."""
        key = self._key(tensor, multiplier)
        if key not in self._entries:
            self._entries[key] = tensor_statistics(tensor, xla, multiplier)
        return self._entries[key]

    def alias(self, alias: tf.Tensor, original: tf.Tensor) -> None:
        """Records that `alias` holds the same values as `original` (forward values only)."""
        key = self._key(original, None)
        if key in self._entries:
            self._entries[self._key(alias, None)] = self._entries[key]


class TensorAccumulator:
    """Statistic variables of one probed tensor, accumulated over steps."""

    def __init__(self, name: str):
        safe_name = variable_name(name, "tensor")
        with tf.init_scope():
            self._strategy = tf.distribute.get_strategy()
            self.counts = _statistic_variable(
                tf.zeros([RAW_COUNT_SLOTS], tf.int64), f"autoprec_counts_{safe_name}"
            )
            self.floats = _statistic_variable(
                tf.constant([0.0, np.inf, 0.0, 0.0], tf.float64), f"autoprec_floats_{safe_name}"
            )

    def update(
        self,
        tensor: tf.Tensor,
        xla: bool,
        multiplier: tf.Tensor | None = None,
        cache: StatisticsCache | None = None,
    ) -> None:
        """Adds the statistics of `tensor` (in the current graph or eagerly)."""
        if cache is None or not tf.is_symbolic_tensor(tensor):
            counts, floats = tensor_statistics(tensor, xla, multiplier)
        else:
            counts, floats = cache.statistics(tensor, xla, multiplier)
        self.counts.assign_add(counts)
        self.floats.assign(combine_floats(self.floats.read_value(), floats))

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """Returns `(counts, floats)` as NumPy arrays, combined over replicas."""
        counts = sum(
            np.asarray(local.numpy(), np.int64)
            for local in self._strategy.experimental_local_results(self.counts)
        )
        locals_ = [
            np.asarray(local.numpy(), np.float64)
            for local in self._strategy.experimental_local_results(self.floats)
        ]
        stacked = np.stack(locals_)
        floats = np.array(
            [
                stacked[:, 0].max(),
                stacked[:, 1].min(),
                stacked[:, 2].sum(),
                stacked[:, 3].sum(),
            ]
        )
        return counts, floats


class StepCounter:
    """Counts train steps run with probes (per replica; read as the largest replica count)."""

    def __init__(self):
        with tf.init_scope():
            self._strategy = tf.distribute.get_strategy()
            self.variable = _statistic_variable(tf.constant(0, tf.int64), "autoprec_steps")

    def increment(self, batch: object = None) -> None:
        """Adds one step (call inside the traced train step)."""
        inputs = [value for value in tf.nest.flatten(batch) if isinstance(value, tf.Tensor)]
        with tf.control_dependencies(inputs[:1]):
            self.variable.assign_add(tf.constant(1, tf.int64))

    def read(self) -> int:
        """Returns the number of steps recorded."""
        return int(
            max(
                int(local.numpy())
                for local in self._strategy.experimental_local_results(self.variable)
            )
        )


def _statistic_variable(initial_value: tf.Tensor, name: str) -> tf.Variable:
    return tf.Variable(
        initial_value,
        trainable=False,
        name=name,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM,
    )


def probe(
    tensor: tf.Tensor,
    forward: TensorAccumulator | None,
    backward: TensorAccumulator | None,
    xla: bool,
    gradient_multiplier: tf.Tensor | None = None,
    cache: StatisticsCache | None = None,
) -> tf.Tensor:
    """Returns `tensor` through an identity that records it and its gradient."""

    @tf.custom_gradient
    def identity(value):
        if forward is not None:
            forward.update(value, xla, cache=cache)

        def gradient(upstream):
            if backward is not None:
                backward.update(upstream, xla, gradient_multiplier, cache)
            return upstream

        return tf.identity(value), gradient

    observed = identity(tensor)
    if cache is not None and forward is not None:
        cache.alias(observed, tensor)
    return observed


def record(
    accumulator: TensorAccumulator,
    tensor: tf.Tensor | tf.IndexedSlices,
    xla: bool,
    multiplier: tf.Tensor | None = None,
    cache: StatisticsCache | None = None,
) -> None:
    """Records a tensor that needs no gradient (weights, weight gradients, internals)."""
    if isinstance(tensor, tf.IndexedSlices):
        tensor = tensor.values
    accumulator.update(tensor, xla, multiplier, cache)


def is_float_tensor(value: object) -> bool:
    """Returns whether `value` is a TensorFlow tensor with a floating-point dtype."""
    return isinstance(value, tf.Tensor) and value.dtype.is_floating


def inverse_loss_scale(optimizer: object) -> tf.Tensor | None:
    """Returns `1 / loss scale` of a Keras optimizer as a tensor, or `None` without scaling."""
    scales = getattr(optimizer, "scale_loss", None)
    if scales is None:
        return None
    is_loss_scale_optimizer = hasattr(optimizer, "inner_optimizer")
    if not is_loss_scale_optimizer and getattr(optimizer, "loss_scale_factor", None) is None:
        return None
    scale = tf.cast(scales(tf.constant(1.0, tf.float32)), tf.float32)
    return tf.math.reciprocal(scale)


class ProbeHooks:
    """The profiler's step hooks on TensorFlow: statistic variables updated inside the traced step."""

    def __init__(self, xla: bool = False) -> None:
        self._xla = xla
        self._accumulators: dict[tuple[str, str, str], TensorAccumulator] = {}
        self._recording = False
        self._multiplier: tf.Tensor | None = None
        self._cache: StatisticsCache | None = None
        self._counter: StepCounter | None = None

    @property
    def recording(self) -> bool:
        """Whether the wrapped train step is being traced now."""
        return self._recording

    @property
    def tensor_count(self) -> int:
        """Number of accumulators created so far."""
        return len(self._accumulators)

    def install_step(self, model, owners, replace) -> None:
        """Wraps `model.train_step` and its optimizer's `apply_gradients` on the instances."""
        replace(model, "train_step", self._wrap_train_step(model, model.train_step))
        optimizer = model.optimizer
        replace(optimizer, "apply_gradients", self._wrap_apply(optimizer.apply_gradients, owners))

    def rebuild_train_function(self, model) -> None:
        """Rebuilds the model's train function (`make_train_function(force=True)`)."""
        model.make_train_function(force=True)

    def _wrap_train_step(self, model, original: Callable) -> Callable:
        hooks = self

        @functools.wraps(original)
        def train_step(data):
            hooks._recording = True
            try:
                if hooks._counter is None:
                    hooks._counter = StepCounter()
                hooks._counter.increment(data)
                hooks._multiplier = inverse_loss_scale(model.optimizer)
                hooks._cache = StatisticsCache()
                return original(data)
            finally:
                hooks._recording = False
                hooks._multiplier = None
                hooks._cache = None

        return train_step

    def _wrap_apply(self, original: Callable, owners) -> Callable:
        hooks = self

        @functools.wraps(original)
        def apply_gradients(grads_and_vars):
            pairs = list(grads_and_vars)
            if hooks._recording:
                for gradient, variable in pairs:
                    owner = owners.get(id(variable))
                    if owner is None or gradient is None:
                        continue
                    path, name = owner
                    record(
                        hooks._accumulator((path, "weight_gradients", name)),
                        gradient,
                        hooks._xla,
                        hooks._multiplier,
                        hooks._cache,
                    )
                    record(hooks._accumulator((path, "weights", name)), variable.value, hooks._xla)
            return original(pairs)

        return apply_gradients

    def _accumulator(self, slot: tuple[str, str, str]) -> TensorAccumulator:
        if slot not in self._accumulators:
            self._accumulators[slot] = TensorAccumulator("/".join(slot))
        return self._accumulators[slot]

    def probe(self, tensor: tf.Tensor, forward, backward) -> tf.Tensor:
        """Returns `tensor` through `probe`, recording it and its gradient in the slots'
        accumulators."""
        return probe(
            tensor,
            self._accumulator(forward),
            self._accumulator(backward),
            self._xla,
            self._multiplier,
            self._cache,
        )

    def record(self, slot, tensor: tf.Tensor) -> None:
        """Records a forward value that needs no gradient into its slot's accumulator."""
        record(self._accumulator(slot), tensor, self._xla)

    def read(self) -> dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]:
        """Returns `{slot: (counts, floats)}`, each combined over replicas."""
        return {slot: accumulator.read() for slot, accumulator in self._accumulators.items()}

    def steps_recorded(self) -> int:
        """Returns the number of train steps run with the probes so far."""
        return 0 if self._counter is None else self._counter.read()


_XLA_SUPPORT: dict[str, bool] = {}


def xla_can_host_probes() -> bool:
    """Returns whether a probe compiles under XLA on this machine (checked once per process)."""
    if "result" not in _XLA_SUPPORT:
        _XLA_SUPPORT["result"] = _try_xla_probe()
    return _XLA_SUPPORT["result"]


def _try_xla_probe() -> bool:
    forward = TensorAccumulator("xla_check_forward")
    backward = TensorAccumulator("xla_check_backward")

    @tf.function(jit_compile=True)
    def step(value):
        with tf.GradientTape() as tape:
            tape.watch(value)
            observed = probe(value, forward, backward, xla=True)
            loss = tf.reduce_sum(observed * observed)
        return tape.gradient(loss, value)

    try:
        step(tf.constant([[0.0, 1.5e-45, -2.0], [np.inf, 3.0, 1e30]], tf.float32))
    except Exception:  # noqa: BLE001 - any compile failure means "no XLA"
        return False
    return True


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


class TelemetryHooks:
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
        self, model: keras.Model, recorder: Any, owners: Mapping[int, int]
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

    def watch_gradient(self, recorder: Any, trace: Any, index: int, value: Any) -> Any:
        """Returns `value` through a custom-gradient identity recording the gradient's amax."""

        @ops.custom_gradient
        def identity(value):
            def gradient(*args, upstream=None):
                if upstream is None:
                    (upstream,) = args
                current = recorder.active_step()
                if current is not None:
                    bits = amax_bits(upstream, current.integer)
                    recorder.record_activation_gradient(current, index, bits)
                return upstream

            return ops.copy(value), gradient

        return identity(value)

    def _wrap_train_step(self, model: keras.Model, recorder: Any) -> Callable:
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

    def _write(self, recorder: Any, frame: Any) -> None:
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


def _wrap_apply_gradients(original: Callable, recorder: Any, owners: Mapping[int, int]) -> Callable:
    @functools.wraps(original)
    def apply_gradients(grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        trace = recorder.active_step()
        if trace is not None:
            for gradient, variable in pairs:
                if gradient is not None:
                    recorder.record_weight_gradient(trace, owners.get(id(variable)), gradient)
            if replicas_in_sync() > 1:
                pairs = _skipped_on_every_replica(pairs, trace.gradients_finite())
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
