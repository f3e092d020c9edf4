"""TensorFlow side of autoprec: statistic and telemetry variables updated inside the traced step
(one copy per replica), one tensor's raw statistics in-graph, TensorBoard event files, and the
compiled steps cost calibration times."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from .instrument import (
    BIASED_EXPONENT_BINS,
    FLOAT32_EXPONENT_BIAS,
    INFINITY_BITS,
    MANTISSA_BITS,
    SMALLEST_NORMAL_BITS,
    SUBNORMAL_EXPONENTS,
    HistogramSeries,
    KeptStep,
    Replace,
    combine_totals,
    empty_totals,
)

#: Magnitudes from 2^40 up take the rescaled (exact) branch: their summed squares could overflow.
_LARGE_BIASED_EXPONENT = FLOAT32_EXPONENT_BIAS + 40


def _count_values(indices: tf.Tensor, slots: int, xla: bool) -> tf.Tensor:
    """Counts occurrences of each integer in `[0, slots)` (int32 result)."""
    if xla:
        return tf.math.unsorted_segment_sum(tf.ones_like(indices), indices, slots)
    return tf.raw_ops.DenseBincount(
        input=indices, size=slots, weights=tf.zeros([0], tf.int32), binary_output=False
    )


def _subnormal_counts(bits: tf.Tensor, xla: bool) -> tf.Tensor:
    """Counts float32 subnormals by exact exponent (-149 .. -127); `bits` are of `|x|`."""
    is_subnormal = tf.logical_and(bits > 0, bits < SMALLEST_NORMAL_BITS)
    # For a subnormal, |x| = m * 2^-149 with integer m < 2^23: floor(log2(m)) is
    # the biased exponent of float32(m) (exact) minus the bias.
    mantissa_exponent = (
        tf.bitwise.right_shift(tf.bitcast(tf.cast(bits, tf.float32), tf.int32), MANTISSA_BITS)
        - FLOAT32_EXPONENT_BIAS
    )
    slots = tf.where(is_subnormal, mantissa_exponent, SUBNORMAL_EXPONENTS)
    return _count_values(slots, SUBNORMAL_EXPONENTS + 1, xla)[:SUBNORMAL_EXPONENTS]


def _plain_sums(flat: tf.Tensor, magnitude: tf.Tensor) -> tf.Tensor:
    """Max, sum |x| and sum x^2 of an all-finite tensor of moderate magnitude."""
    return tf.stack(
        [
            tf.cast(tf.reduce_max(magnitude), tf.float64),
            tf.cast(tf.reduce_sum(magnitude), tf.float64),
            tf.cast(2.0 * tf.nn.l2_loss(flat), tf.float64),  # L2Loss: half the sum of squares
        ]
    )


def _masked_rescaled_sums(bits: tf.Tensor, magnitude: tf.Tensor) -> tf.Tensor:
    """Max, sum |x| and sum x^2 over finite values, rescaled by a power of two to avoid overflow."""
    finite = tf.where(bits < INFINITY_BITS, magnitude, tf.zeros_like(magnitude))
    largest = tf.reduce_max(finite)
    exponent = tf.where(
        largest > 0,
        tf.cast(tf.bitwise.right_shift(tf.bitcast(largest, tf.int32), MANTISSA_BITS), tf.float32)
        - FLOAT32_EXPONENT_BIAS,
        0.0,
    )
    scaled = finite * tf.pow(2.0, -exponent)
    factor = tf.pow(tf.constant(2.0, tf.float64), tf.cast(exponent, tf.float64))
    return tf.stack(
        [
            tf.cast(largest, tf.float64),
            tf.cast(tf.reduce_sum(scaled), tf.float64) * factor,
            tf.cast(2.0 * tf.nn.l2_loss(scaled), tf.float64) * factor * factor,
        ]
    )


def _flat_statistics(flat: tf.Tensor, xla: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """Raw statistics of a 1-D float32 tensor: int64 counts and float64 `FLOAT_SLOTS`."""
    magnitude = tf.abs(flat)
    bits = tf.bitcast(magnitude, tf.int32)
    biased_counts = _count_values(
        tf.bitwise.right_shift(bits, MANTISSA_BITS), BIASED_EXPONENT_BINS, xla
    )
    smallest_bits = tf.reduce_min(tf.bitcast(bits, tf.uint32) - 1) + 1
    has_finite_nonzero = tf.logical_and(smallest_bits > 0, smallest_bits < INFINITY_BITS)
    min_nonzero = tf.where(
        has_finite_nonzero,
        tf.cast(tf.bitcast(tf.bitcast(smallest_bits, tf.int32), tf.float32), tf.float64),
        tf.constant(np.inf, tf.float64),
    )
    has_subnormal = tf.logical_and(has_finite_nonzero, smallest_bits < SMALLEST_NORMAL_BITS)
    needs_masking = tf.reduce_sum(biased_counts[_LARGE_BIASED_EXPONENT:]) > 0
    if xla:
        subnormal = _subnormal_counts(bits, xla)
        max_and_sums = _masked_rescaled_sums(bits, magnitude)
        nan_bits = bits
    else:  # slices of length 0 skip the work a tensor does not need
        size = tf.size(flat)
        subnormal = _subnormal_counts(bits[: tf.where(has_subnormal, size, 0)], xla)
        masked_size = tf.where(needs_masking, size, 0)
        plain_size = size - masked_size
        max_and_sums = tf.where(
            needs_masking,
            _masked_rescaled_sums(bits[:masked_size], magnitude[:masked_size]),
            _plain_sums(flat[:plain_size], magnitude[:plain_size]),
        )
        nan_bits = bits[: tf.where(biased_counts[BIASED_EXPONENT_BINS - 1] > 0, size, 0)]
    nans = tf.reduce_sum(tf.cast(nan_bits > INFINITY_BITS, tf.int32))
    zeros = biased_counts[0] - tf.reduce_sum(subnormal)
    counts = tf.concat(
        [tf.reshape(zeros, [1]), biased_counts[1:], subnormal, tf.reshape(nans, [1])], axis=0
    )
    floats = tf.stack([max_and_sums[0], min_nonzero, max_and_sums[1], max_and_sums[2]])
    return tf.cast(counts, tf.int64), floats


def combine_floats(current: tf.Tensor, new: tf.Tensor) -> tf.Tensor:
    """Accumulates float slots (last axis): max of maxima, min of minima, sums of sums."""
    by_max, by_min = [True, False, False, False], [False, True, False, False]
    return tf.where(
        by_max, tf.maximum(current, new), tf.where(by_min, tf.minimum(current, new), current + new)
    )


def _amax_statistics(flat: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The `amax` selection: the largest finite magnitude, the non-finite and NaN counts."""
    bits = tf.bitcast(tf.abs(flat), tf.int32)
    finite = bits < INFINITY_BITS
    largest = tf.reduce_max(tf.where(finite, tf.abs(flat), 0.0))
    non_finite = tf.reduce_sum(tf.cast(tf.logical_not(finite), tf.int64))
    nans = tf.reduce_sum(tf.cast(bits > INFINITY_BITS, tf.int64))
    zeros = tf.zeros([BIASED_EXPONENT_BINS - 1], tf.int64)
    subnormal = tf.zeros([SUBNORMAL_EXPONENTS], tf.int64)
    counts = tf.concat([zeros, [non_finite], subnormal, [nans]], axis=0)
    floats = tf.stack([tf.cast(largest, tf.float64), np.inf, 0.0, 0.0])
    return counts, floats


@functools.cache
def _statistics_function(xla: bool, statistics: str = "histograms") -> Callable:
    """Returns a `tf.function` computing `(counts, floats)` of a 1-D tensor, traced once."""

    @tf.function(
        input_signature=[tf.TensorSpec([None], tf.float32)],
        autograph=False,
        experimental_attributes={"_noinline": True},
    )
    def compute(flat):
        if statistics == "amax":
            return _amax_statistics(flat)
        return _flat_statistics(flat, xla)

    return compute


def tensor_statistics(
    tensor: tf.Tensor,
    xla: bool = False,
    multiplier: tf.Tensor | None = None,
    statistics: str = "histograms",
) -> tuple[tf.Tensor, tf.Tensor]:
    """Computes the raw statistics of one tensor, as float32 without gradient, times `multiplier`."""
    flat = tf.cast(tf.reshape(tf.stop_gradient(tensor), [-1]), tf.float32)
    if multiplier is not None:
        flat = flat * tf.cast(multiplier, tf.float32)
    return _statistics_function(xla, statistics)(flat)


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
        self,
        tensor: tf.Tensor,
        xla: bool,
        multiplier: tf.Tensor | None,
        statistics: str = "histograms",
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """Returns the statistics of `tensor`, computing them on the first request."""
        key = self._key(tensor, multiplier)
        if key not in self._entries:
            self._entries[key] = tensor_statistics(tensor, xla, multiplier, statistics)
        return self._entries[key]

    def alias(self, alias: tf.Tensor, original: tf.Tensor) -> None:
        """Records that `alias` holds the same values as `original` (forward values only)."""
        key = self._key(original, None)
        if key in self._entries:
            self._entries[self._key(alias, None)] = self._entries[key]


class TensorAccumulator:
    """Statistic variables of one probed tensor, accumulated over steps."""

    def __init__(self, name: str, statistics: str = "histograms"):
        self.statistics = statistics
        counts, floats = empty_totals()
        self.counts = replica_local_variable(counts, f"autoprec_counts_{name}")
        self.floats = replica_local_variable(floats, f"autoprec_floats_{name}")

    def update(
        self,
        tensor: tf.Tensor | tf.IndexedSlices,
        xla: bool,
        multiplier: tf.Tensor | None = None,
        cache: StatisticsCache | None = None,
    ) -> None:
        """Adds the statistics of `tensor` (of a `tf.IndexedSlices`, its values), in a graph or eagerly."""
        if isinstance(tensor, tf.IndexedSlices):
            tensor = tensor.values
        cached = cache is not None and tf.is_symbolic_tensor(tensor)
        compute = cache.statistics if cached else tensor_statistics
        counts, floats = compute(tensor, xla, multiplier, self.statistics)
        self.counts.assign_add(counts)
        self.floats.assign(combine_floats(self.floats.read_value(), floats))

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """Returns `(counts, floats)` as NumPy arrays, combined over replicas."""
        return combine_totals(zip(replica_values(self.counts), replica_values(self.floats)))


class StepCounter:
    """Counts train steps run with probes (per replica; read as the largest replica count)."""

    def __init__(self):
        self.variable = replica_local_variable(np.int64(0), "autoprec_steps")

    def increment(self, batch: object = None) -> None:
        """Adds one step (call inside the traced train step)."""
        inputs = [value for value in tf.nest.flatten(batch) if isinstance(value, tf.Tensor)]
        with tf.control_dependencies(inputs[:1]):
            self.variable.assign_add(tf.constant(1, tf.int64))

    def read(self) -> int:
        """Returns the number of steps recorded."""
        return max(int(value) for value in replica_values(self.variable))


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


def is_float_tensor(value: object) -> bool:
    """Returns whether `value` is a TensorFlow tensor with a floating-point dtype."""
    return isinstance(value, tf.Tensor) and value.dtype.is_floating


def inverse_loss_scale(optimizer: object) -> tf.Tensor | None:
    """Returns `1 / loss scale` of a Keras optimizer as a tensor, or `None` without scaling."""
    scales = getattr(optimizer, "scale_loss", None)
    unscaled = getattr(optimizer, "loss_scale_factor", None) is None
    if scales is None or (unscaled and not hasattr(optimizer, "inner_optimizer")):
        return None
    return tf.math.reciprocal(tf.cast(scales(tf.constant(1.0, tf.float32)), tf.float32))


class ProbeHooks:
    """The in-step instrumentation on TensorFlow: probes updating statistic variables inside the
    traced step (`"histograms"` or `"amax"`), and a copy of each skipped step's batch."""

    def __init__(self, xla: bool = False, statistics: str = "histograms") -> None:
        self._xla = xla
        self._statistics = statistics
        self._accumulators: dict[tuple[str, str, str], TensorAccumulator] = {}
        #: Whether the wrapped train step is being traced now.
        self.recording = False
        self._multiplier: tf.Tensor | None = None
        self._cache: StatisticsCache | None = None
        self._counter: StepCounter | None = None
        self._kept = _KeptBatch()
        self.paused = False

    @property
    def tensor_count(self) -> int:
        """Number of accumulators created so far."""
        return len(self._accumulators)

    def install_step(self, model, owners, replace) -> None:
        """Wraps `model.train_step` and its optimizer's `apply_gradients` on the instances."""
        replace(model, "train_step", self._wrap_train_step(model, model.train_step))
        optimizer = model.optimizer
        replace(optimizer, "apply_gradients", self._wrap_apply(optimizer.apply_gradients, owners))

    def _wrap_train_step(self, model, original: Callable) -> Callable:
        @functools.wraps(original)
        def train_step(data):
            self.recording = True
            try:
                if self._counter is None:
                    self._counter = StepCounter()
                self._counter.increment(data)
                self._multiplier = inverse_loss_scale(model.optimizer)
                self._cache = StatisticsCache()
                return original(data)
            finally:
                self.recording = False
                self._multiplier = None
                self._cache = None

        return train_step

    def _wrap_apply(self, original: Callable, owners) -> Callable:
        @functools.wraps(original)
        def apply_gradients(grads_and_vars):
            pairs = list(grads_and_vars)
            if self.recording:
                for gradient, variable in pairs:
                    owner = owners.get(id(variable))
                    if owner is None or gradient is None:
                        continue
                    path, name = owner
                    self._accumulator((path, "weight_gradients", name)).update(
                        gradient, self._xla, self._multiplier, self._cache
                    )
                    self.record((path, "weights", name), variable.value)
            return original(pairs)

        return apply_gradients

    def _accumulator(self, slot: tuple[str, str, str]) -> TensorAccumulator:
        if slot not in self._accumulators:
            self._accumulators[slot] = TensorAccumulator("/".join(slot), self._statistics)
        return self._accumulators[slot]

    def probe(self, tensor: tf.Tensor, forward, backward) -> tf.Tensor:
        """Returns `tensor` through `probe`, recording it and its gradient in the slots."""
        accumulators = self._accumulator(forward), self._accumulator(backward)
        return probe(tensor, *accumulators, self._xla, self._multiplier, self._cache)

    def record(self, slot, tensor: tf.Tensor) -> None:
        """Records a forward value that needs no gradient into its slot's accumulator."""
        self._accumulator(slot).update(tensor, self._xla)

    def read(self) -> dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]:
        """Returns `{slot: (counts, floats)}`, each combined over replicas."""
        return {slot: accumulator.read() for slot, accumulator in self._accumulators.items()}

    def steps_recorded(self) -> int:
        """Returns the number of train steps run with the probes so far."""
        return 0 if self._counter is None else self._counter.read()

    def reset(self) -> None:
        """Sets the recorded statistics and steps back to none (zero or inf: the same per replica)."""
        for accumulator in self._accumulators.values():
            for variable, value in zip((accumulator.counts, accumulator.floats), empty_totals()):
                variable.assign(value)
        if self._counter is not None:
            self._counter.variable.assign(np.int64(0))

    # -- the guard's failed steps: no probe, a copy of the batch the optimizer skipped

    def keep_failed_steps(self, model: keras.Model, replace: Replace) -> None:
        """Wraps `model.train_step` to copy the batch and loss scale of each skipped step."""
        original = model.train_step

        @functools.wraps(original)
        def train_step(data):
            streak = getattr(model.optimizer, "consecutive_non_finite_steps", None)
            if streak is None or self.paused:  # paused: a replay traces this step
                return original(data)
            scale = _loss_scale(model.optimizer)
            outputs = original(data)
            failed = streak.value > 0  # read once, after the step: 0 after a step applied
            self._kept.keep(data, scale, failed, bool(getattr(model, "jit_compile", False)))
            return outputs

        replace(model, "train_step", train_step)

    def kept_step(self) -> KeptStep | None:
        """Returns the newest step skipped since the last call, or `None`."""
        return self._kept.read()


def _loss_scale(optimizer: Any) -> tf.Tensor:
    """The loss scale the step runs at, as a float32 scalar (1 without scaling)."""
    scale = getattr(optimizer, "dynamic_scale", None)
    return tf.constant(1.0) if scale is None else tf.identity(tf.cast(scale.value, tf.float32))


def _global_batch(variable: tf.Variable) -> np.ndarray:
    """The kept batch: every replica's part, in replica order (the whole batch on one replica)."""
    parts = replica_values(variable)
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


def _batch_copy(leaf: tf.Tensor, xla: bool) -> tf.Variable:
    """A variable to copy a batch's tensor into: of any shape, or of its static shape under XLA."""
    if xla and leaf.shape.is_fully_defined():
        initial, shape = tf.zeros(leaf.shape, leaf.dtype), leaf.shape
    else:
        initial, shape = tf.zeros([0], leaf.dtype), tf.TensorShape(None)
    return tf.Variable(
        initial, shape=shape, validate_shape=shape.rank is not None, trainable=False,
        name="autoprec_kept_batch", synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.NONE,
    )  # fmt: skip


def _untracked(next_creator: Callable, **kwargs: Any) -> tf.Variable:
    """Creates a variable the tracing `tf.function` does not track, so it traces only once."""
    return next_creator(**{**kwargs, "experimental_enable_variable_lifting": False})


class _KeptBatch:
    """Variables (one set per replica) holding the batch and loss scale of the newest skipped step."""

    def __init__(self) -> None:
        self._count: tf.Variable | None = None
        self._scale: tf.Variable | None = None
        self._values: list[tf.Variable | None] = []
        self._structure: Any = None
        self._read = 0

    def keep(self, data: Any, scale: tf.Tensor, failed: tf.Tensor, xla: bool) -> None:
        """Copies `data` and `scale` where `failed` (traced); under XLA the copies have the first
        trace's static shapes, so a batch of another shape (a partial last batch) is not kept."""
        leaves = tf.nest.flatten(data)
        if self._count is None:
            self._structure = data
            with tf.init_scope(), tf.variable_creator_scope(_untracked):  # no second trace
                self._count = replica_local_variable(np.int64(0), "autoprec_kept_steps")
                self._scale = replica_local_variable(np.float32(1.0), "autoprec_kept_scale")
                self._values = [None if leaf is None else _batch_copy(leaf, xla) for leaf in leaves]
        if xla and any(
            variable is not None and variable.shape != leaf.shape
            for variable, leaf in zip(self._values, leaves)
        ):
            return

        def keep() -> tf.Tensor:
            for variable, leaf in zip(self._values, leaves):
                if variable is not None:
                    variable.assign(leaf)
            self._scale.assign(scale)
            return self._count.assign_add(1)

        tf.cond(failed, keep, lambda: tf.identity(self._count))

    def read(self) -> KeptStep | None:
        if self._count is None:
            return None
        count = max(int(value) for value in replica_values(self._count))
        if count == self._read:
            return None
        self._read = count
        leaves = [None if v is None else _global_batch(v) for v in self._values]
        batch = tf.nest.pack_sequence_as(self._structure, leaves)
        return KeptStep(batch, float(replica_values(self._scale)[0]))


@functools.cache
def xla_can_host_probes() -> bool:
    """Returns whether a probe compiles under XLA on this machine (checked once per process)."""
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
    """Returns a variable each replica updates on its own, created outside any trace (and
    untracked by it, so that a `tf.function` creating it traces once)."""
    with tf.init_scope(), tf.variable_creator_scope(_untracked):
        return tf.Variable(
            initial_value,
            trainable=False,
            name=variable_name(name, "telemetry"),
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM,
        )


def replica_values(variable: tf.Variable) -> list[np.ndarray]:
    """Returns the value of every replica's copy of `variable`, as NumPy arrays."""
    strategy = getattr(variable, "distribute_strategy", None) or tf.distribute.get_strategy()
    return [np.asarray(local.numpy()) for local in strategy.experimental_local_results(variable)]


def slice_values(grads: Sequence[Any]) -> list[Any]:
    """The gradients with each `tf.IndexedSlices` replaced by its values, one row per slice."""
    return [grad.values if isinstance(grad, tf.IndexedSlices) else grad for grad in grads]


def every_replica(flag: Any) -> tf.Tensor:
    """Returns whether `flag` holds on every replica (one all-reduce; `flag` itself on one replica)."""
    flag = tf.convert_to_tensor(flag, tf.bool)
    context = tf.distribute.get_replica_context()
    if context is None or int(context.num_replicas_in_sync) == 1:
        return flag
    failing = tf.cast(tf.logical_not(flag), tf.int32)
    return tf.equal(context.all_reduce(tf.distribute.ReduceOp.SUM, failing), 0)


# TensorBoard output: exponent histograms, scalars and text as event files.


def write_histograms(logdir: str | os.PathLike, series: HistogramSeries, step: int = 0) -> None:
    """Writes exponent histograms as TensorBoard histogram summaries."""
    writer = tf.summary.create_file_writer(str(logdir))
    with writer.as_default():
        for tag, exponents, counts in series:
            exponents = np.asarray(exponents, np.float64)
            buckets = np.stack([exponents, exponents + 1.0, np.asarray(counts, np.float64)], axis=1)
            _write_plugin_summary(tag, tf.constant(buckets), step, "histograms")
    writer.flush()
    writer.close()


def _write_plugin_summary(tag: str, tensor: tf.Tensor, step: int, plugin: str) -> None:
    """Writes one summary in a TensorBoard plugin's format, without needing TensorBoard."""
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata(display_name=tag)
    metadata.plugin_data.plugin_name = plugin
    tf.summary.write(tag=tag, tensor=tensor, step=step, metadata=metadata)


class SummaryWriter:
    """Writes scalars and text next to Keras' own TensorBoard logs (one event file per run)."""

    def __init__(self, logdir: str | os.PathLike) -> None:
        self._writer = tf.summary.create_file_writer(str(logdir))

    def write(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None:
        """Writes `scalars` and Markdown `texts` at `step` and flushes."""
        with self._writer.as_default():
            for tag, value in scalars.items():
                _write_plugin_summary(tag, tf.constant(float(value), tf.float32), step, "scalars")
            for tag, text in texts.items():
                _write_plugin_summary(tag, tf.constant(text), step, "text")
        self._writer.flush()

    def close(self) -> None:
        """Flushes and closes the event file."""
        self._writer.close()


# Cost calibration: compiled forward+backward steps, casts and dispatch.


def versions() -> dict[str, str]:
    """Framework versions that key the cost cache."""
    return {"tensorflow": tf.__version__}


def to_device(value: Any) -> Any:
    """Returns `value` unchanged: `train_on_batch` converts NumPy batches each step."""
    return value


def random_tensor(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> tf.Tensor:
    """A standard-normal tensor of `shape`, drawn with `rng`, in `dtype`."""
    values = rng.standard_normal(shape).astype("float32")
    return tf.cast(tf.constant(values), dtype)


def layer_step(layer, args: list, kwargs: dict, jit_compile: bool) -> Callable[[], Any]:
    """A compiled forward and backward pass of `layer` on fixed inputs and upstream gradients."""
    outputs = layer(*args, **kwargs)
    float_outputs = [t for t in tf.nest.flatten(outputs) if t.dtype.is_floating]
    upstream = [tf.cast(tf.random.normal(t.shape), t.dtype) for t in float_outputs]
    float_inputs = [
        t for t in tf.nest.flatten((args, kwargs)) if tf.is_tensor(t) and t.dtype.is_floating
    ]
    variables = list(layer.trainable_variables)

    @tf.function(jit_compile=jit_compile, autograph=False)
    def step():
        with tf.GradientTape() as tape:
            tape.watch(float_inputs)
            results = layer(*args, **kwargs)
            flat = [t for t in tf.nest.flatten(results) if t.dtype.is_floating]
        gradients = tape.gradient(flat, float_inputs + variables, output_gradients=upstream)
        touched = [tf.reshape(g, [-1])[:1] for g in gradients if g is not None]
        touched += [tf.reshape(t, [-1])[:1] for t in flat]
        return tf.add_n([tf.cast(tf.reduce_sum(t), tf.float32) for t in touched])

    return lambda: step().numpy()


def empty_step() -> Callable[[], Any]:
    """The cheapest compiled call: what one dispatch costs."""
    value = tf.constant([1.0])

    @tf.function(autograph=False)
    def step():
        return tf.reduce_sum(value + 1.0)

    return lambda: step().numpy()


def cast_step(dtype: str, elements: int) -> Callable[[], Any]:
    """A compiled float32 -> `dtype` -> float32 round trip over `elements` values."""
    source = tf.random.normal([elements])
    target_dtype = tf.as_dtype(dtype)

    @tf.function(autograph=False)
    def step():
        return tf.cast(tf.cast(source, target_dtype), tf.float32)[0]

    return lambda: step().numpy()
