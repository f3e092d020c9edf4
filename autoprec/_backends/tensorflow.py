"""TensorFlow side of the profiler: statistic variables, in-graph probes and TensorBoard output.

The profiler (backend neutral) decides *what* to record; this module records
it inside the compiled train step (`ProbeHooks`, the interface of
`probe_hooks`; `jax_probes` is the JAX side). The TensorFlow side of cost calibration is
`tensorflow_timing`, that of the guard's telemetry `tensorflow_telemetry`.

**How a tensor is measured** (a handful of passes over the data, no sorting):
the float32 bit pattern of `|x|` is shifted right by 23 bits, which gives the
biased binary exponent (0: zero or subnormal, 255: inf or NaN), and those are
counted with `tf.math.bincount` (`unsorted_segment_sum` under XLA, which cannot
compile a bincount). The smallest non-zero magnitude comes from the minimum of
`bits - 1` taken as unsigned (zeros wrap to the largest value), the largest
magnitude and the sums from plain reductions. Two rare cases take a slower,
exact branch through `tf.cond`: float32 subnormals (resolved into exact
exponents) and non-finite or huge values (masked and rescaled sums).

**Accumulators** are `tf.Variable`s created once, under `tf.init_scope`, the
first time a probe is traced; they are not Keras weights (not tracked by any
layer), so a model's weights and saved files never see them. They are created
with `synchronization=ON_READ, aggregation=SUM`, so under a
`tf.distribute.MirroredStrategy` every replica updates its own copy; the
copies are read one by one and combined (sums for counts, max/min for
extremes).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable

import numpy as np
import tensorflow as tf

_MANTISSA_BITS = 23
_BIASED_EXPONENT_BINS = 256
_NONFINITE_BIN = 255
_SUBNORMAL_EXPONENTS = 23
_SMALLEST_NORMAL_BITS = 1 << _MANTISSA_BITS
_INFINITY_BITS = 0x7F800000
_FLOAT32_EXPONENT_BIAS = 127
_SMALLEST_SUBNORMAL_EXPONENT = -149
#: Magnitudes from 2^40 up take the rescaled (exact) branch: squares of such
#: values summed over a large tensor could overflow float32.
_LARGE_BIASED_EXPONENT = _FLOAT32_EXPONENT_BIAS + 40

#: Length of the raw count vector: 256 biased-exponent slots (slot 0 holds the
#: zeros, slot 255 the non-finite values), 23 float32 subnormal exponents
#: (-149 .. -127), then one slot counting the NaNs among the non-finite values
#: (an overflow gives inf; a NaN usually comes from the data or 0 * inf).
RAW_COUNT_SLOTS = _BIASED_EXPONENT_BINS + _SUBNORMAL_EXPONENTS + 1
#: Order of the float accumulator slots.
FLOAT_SLOTS = ("max_abs", "min_nonzero_abs", "sum_abs", "sum_squares")

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def variable_name(name: str, fallback: str) -> str:
    """Returns `name` made safe for a `tf.Variable` (odd characters as `_`, 120 at most).

    Args:
        name: a readable name, e.g. a layer path.
        fallback: the name used when nothing of `name` is left.

    Returns:
        The variable name.

    Example:

    ```python
    variable_name("block/dense 1", "tensor")  # "block_dense_1"
    ```
    """
    return _NAME_UNSAFE.sub("_", name)[:120] or fallback


def _count_values(indices: tf.Tensor, slots: int, xla: bool) -> tf.Tensor:
    """Counts occurrences of each integer in `[0, slots)` (int32 result).

    `DenseBincount` is called directly: `tf.math.bincount` adds a full
    `reduce_max` pass over the indices to size its output, which a fixed
    number of slots does not need.
    """
    if xla:
        return tf.math.unsorted_segment_sum(tf.ones_like(indices), indices, slots)
    return tf.raw_ops.DenseBincount(
        input=indices, size=slots, weights=tf.zeros([0], tf.int32), binary_output=False
    )


def _sum_of_squares(values: tf.Tensor) -> tf.Tensor:
    """Sum of squares of a 1-D float32 tensor in one pass (`L2Loss` is half of it).

    `tensordot` of a vector with itself is several times slower, and
    `reduce_sum(square(x))` takes two passes and a temporary.
    """
    return 2.0 * tf.nn.l2_loss(values)


def _subnormal_counts(bits: tf.Tensor, xla: bool) -> tf.Tensor:
    """Counts float32 subnormals by exact exponent (-149 .. -127); `bits` are of `|x|`."""
    is_subnormal = tf.logical_and(bits > 0, bits < _SMALLEST_NORMAL_BITS)
    # For a subnormal, |x| = m * 2^-149 with integer m < 2^23: floor(log2(m)) is
    # the biased exponent of float32(m) (exact) minus the bias.
    mantissa_exponent = (
        tf.bitwise.right_shift(tf.bitcast(tf.cast(bits, tf.float32), tf.int32), _MANTISSA_BITS)
        - _FLOAT32_EXPONENT_BIAS
    )
    slots = tf.where(is_subnormal, mantissa_exponent, _SUBNORMAL_EXPONENTS)
    return _count_values(slots, _SUBNORMAL_EXPONENTS + 1, xla)[:_SUBNORMAL_EXPONENTS]


def _plain_sums(flat: tf.Tensor, magnitude: tf.Tensor) -> tf.Tensor:
    """Max, sum |x| and sum x^2 of an all-finite tensor of moderate magnitude."""
    return tf.stack(
        [
            tf.cast(tf.reduce_max(magnitude), tf.float64),
            tf.cast(tf.reduce_sum(magnitude), tf.float64),
            tf.cast(_sum_of_squares(flat), tf.float64),
        ]
    )


def _masked_rescaled_sums(bits: tf.Tensor, magnitude: tf.Tensor) -> tf.Tensor:
    """Max, sum |x| and sum x^2 over finite values, rescaled by a power of two to avoid overflow."""
    finite = tf.where(bits < _INFINITY_BITS, magnitude, tf.zeros_like(magnitude))
    largest = tf.reduce_max(finite)
    exponent = tf.where(
        largest > 0,
        tf.cast(tf.bitwise.right_shift(tf.bitcast(largest, tf.int32), _MANTISSA_BITS), tf.float32)
        - _FLOAT32_EXPONENT_BIAS,
        0.0,
    )
    scaled = finite * tf.pow(2.0, -exponent)
    factor = tf.pow(tf.constant(2.0, tf.float64), tf.cast(exponent, tf.float64))
    return tf.stack(
        [
            tf.cast(largest, tf.float64),
            tf.cast(tf.reduce_sum(scaled), tf.float64) * factor,
            tf.cast(_sum_of_squares(scaled), tf.float64) * factor * factor,
        ]
    )


def _flat_statistics(flat: tf.Tensor, xla: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """Raw statistics of a 1-D float32 tensor: int64 counts and float64 `FLOAT_SLOTS`.

    The rare exact branches (subnormals; non-finite or huge values) run on a
    slice of the data that is empty unless needed: `tf.cond` would cost far
    more graph-building and start-up time per probe. XLA needs static shapes,
    so there every branch runs in full (fused into the same few passes).
    """
    magnitude = tf.abs(flat)
    bits = tf.bitcast(magnitude, tf.int32)
    biased_counts = _count_values(
        tf.bitwise.right_shift(bits, _MANTISSA_BITS), _BIASED_EXPONENT_BINS, xla
    )
    smallest_bits = tf.reduce_min(tf.bitcast(bits, tf.uint32) - 1) + 1
    has_finite_nonzero = tf.logical_and(smallest_bits > 0, smallest_bits < _INFINITY_BITS)
    min_nonzero = tf.where(
        has_finite_nonzero,
        tf.cast(tf.bitcast(tf.bitcast(smallest_bits, tf.int32), tf.float32), tf.float64),
        tf.constant(np.inf, tf.float64),
    )
    has_subnormal = tf.logical_and(has_finite_nonzero, smallest_bits < _SMALLEST_NORMAL_BITS)
    needs_masking = tf.reduce_sum(biased_counts[_LARGE_BIASED_EXPONENT:]) > 0
    if xla:
        subnormal = _subnormal_counts(bits, xla)
        max_and_sums = _masked_rescaled_sums(bits, magnitude)
    else:
        size = tf.size(flat)
        subnormal_size = tf.where(has_subnormal, size, 0)
        subnormal = _subnormal_counts(bits[:subnormal_size], xla)
        masked_size = tf.where(needs_masking, size, 0)
        plain_size = size - masked_size
        max_and_sums = tf.where(
            needs_masking,
            _masked_rescaled_sums(bits[:masked_size], magnitude[:masked_size]),
            _plain_sums(flat[:plain_size], magnitude[:plain_size]),
        )
    has_nonfinite = biased_counts[_BIASED_EXPONENT_BINS - 1] > 0
    if xla:
        nan_bits = bits
    else:
        nan_bits = bits[: tf.where(has_nonfinite, tf.size(flat), 0)]
    nans = tf.reduce_sum(tf.cast(nan_bits > _INFINITY_BITS, tf.int32))
    zeros = biased_counts[0] - tf.reduce_sum(subnormal)
    counts = tf.concat(
        [tf.reshape(zeros, [1]), biased_counts[1:], subnormal, tf.reshape(nans, [1])], axis=0
    )
    floats = tf.stack([max_and_sums[0], min_nonzero, max_and_sums[1], max_and_sums[2]])
    return tf.cast(counts, tf.int64), floats


#: Which float slot combines over steps by maximum and which by minimum (the rest add up).
_COMBINE_BY_MAX = (True, False, False, False)
_COMBINE_BY_MIN = (False, True, False, False)


def _combine_floats(current: tf.Tensor, new: tf.Tensor) -> tf.Tensor:
    """Accumulates float slots (last axis): max of maxima, min of minima, sums of sums."""
    return tf.where(
        _COMBINE_BY_MAX,
        tf.maximum(current, new),
        tf.where(_COMBINE_BY_MIN, tf.minimum(current, new), current + new),
    )


@functools.cache
def _statistics_function(xla: bool) -> Callable:
    """Returns a `tf.function` computing `(counts, floats)` of a 1-D tensor, traced once.

    Calling one traced function per probe keeps each probe to a handful of ops in
    the train step's graph, so tracing a large model stays fast.
    """

    @tf.function(
        input_signature=[tf.TensorSpec([None], tf.float32)],
        autograph=False,
        experimental_attributes={"_noinline": True},
    )
    def statistics(flat):
        return _flat_statistics(flat, xla)

    return statistics


def tensor_statistics(
    tensor: tf.Tensor, xla: bool = False, multiplier: tf.Tensor | None = None
) -> tuple[tf.Tensor, tf.Tensor]:
    """Computes the raw statistics of one tensor (see the module docstring).

    Args:
        tensor: any floating-point tensor; measured in float32.
        xla: whether the graph is compiled with XLA (selects XLA-friendly ops).
        multiplier: optional float32 scalar applied first (to undo a loss scale).

    Returns:
        `(counts, floats)`: int64 `[RAW_COUNT_SLOTS]` counts and float64 values
        in `FLOAT_SLOTS` order.
    """
    return _statistics_function(xla)(_flatten(tensor, multiplier))


class StatisticsCache:
    """Statistics already computed in one traced train step, by tensor.

    One tensor can be the output of several probed layers (a layer returning
    its last sub-layer's output, as MultiHeadAttention does) and the same
    gradient can flow into several of them. With a cache each such tensor is
    measured once and its statistics are added to every accumulator that
    observes it. A probe's output is registered as an alias of its input, so
    an outer layer that returns an inner layer's probed output hits the cache.
    Create one per trace; it holds graph tensors.
    """

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


def _flatten(tensor: tf.Tensor, multiplier: tf.Tensor | None) -> tf.Tensor:
    flat = tf.reshape(tf.stop_gradient(tensor), [-1])
    if flat.dtype != tf.float32:
        flat = tf.cast(flat, tf.float32)
    if multiplier is not None:
        flat = flat * tf.cast(multiplier, tf.float32)
    return flat


class TensorAccumulator:
    """Statistic variables of one probed tensor, accumulated over steps.

    Variables are created on construction under `tf.init_scope` (so this may be
    called while a `tf.function` is being traced) and are not tracked by Keras.

    Args:
        name: a readable name, used for the variable names.
    """

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
        """Adds the statistics of `tensor` (in the current graph or eagerly).

        Args:
            tensor: the tensor to measure.
            xla: whether the graph is compiled with XLA.
            multiplier: optional factor applied before measuring (inverse loss scale).
            cache: statistics already computed in this trace, shared by tensor.
        """
        if cache is None or not tf.is_symbolic_tensor(tensor):
            counts, floats = tensor_statistics(tensor, xla, multiplier)
        else:
            counts, floats = cache.statistics(tensor, xla, multiplier)
        self.counts.assign_add(counts)
        self.floats.assign(_combine_floats(self.floats.read_value(), floats))

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
        """Adds one step (call inside the traced train step).

        Args:
            batch: the step's input batch; the increment waits for it, so a
                step whose input iterator is exhausted is not counted.
        """
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
    """Returns `tensor` through an identity that records it and its gradient.

    Args:
        tensor: the tensor to observe.
        forward: accumulator for the tensor's values (or `None`).
        backward: accumulator for the gradient flowing back into it (or `None`).
        xla: whether the graph is compiled with XLA.
        gradient_multiplier: optional factor applied to gradients before
            recording (the inverse loss scale); the gradient passed on is unchanged.
        cache: statistics already computed in this trace (see `StatisticsCache`).

    Returns:
        A tensor equal to `tensor`, with the same gradient.
    """

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
    tensor: tf.Tensor,
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
    """Returns `1 / loss scale` of a Keras optimizer as a tensor, or `None` without scaling.

    Call inside the traced train step, before the loss is scaled, so that the
    value read is the one the step uses.
    """
    scales = getattr(optimizer, "scale_loss", None)
    if scales is None:
        return None
    is_loss_scale_optimizer = hasattr(optimizer, "inner_optimizer")
    if not is_loss_scale_optimizer and getattr(optimizer, "loss_scale_factor", None) is None:
        return None
    scale = tf.cast(scales(tf.constant(1.0, tf.float32)), tf.float32)
    return tf.math.reciprocal(scale)


class ProbeHooks:
    """The profiler's step hooks on TensorFlow: statistic variables updated inside the traced step.

    The `autoprec._backends.probe_hooks.ProbeHooks` interface. The wrapped
    train step counts the step, reads the inverse loss scale and opens a
    `StatisticsCache` for its trace; layer outputs pass through `probe`, and
    the wrapped `apply_gradients` records each weight and its gradient. The
    accumulators (`TensorAccumulator`) are created the first time a slot is
    traced.

    Args:
        xla: whether the train step is compiled with XLA (selects XLA-friendly ops).

    Example:

    ```python
    hooks = ProbeHooks(xla=False)
    hooks.install_step(model, {id(model.layers[0].kernel): ("dense", "kernel")}, replace)
    ```
    """

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
        """Returns `tensor` through `probe`, recording it and its gradient in the slots' accumulators."""
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


def write_histograms(
    logdir: str | os.PathLike,
    series: Iterable[tuple[str, np.ndarray, np.ndarray]],
    step: int = 0,
    description: Callable[[str], str] | None = None,
) -> None:
    """Writes exponent histograms as TensorBoard histogram summaries.

    Each histogram is stored in TensorBoard's own histogram format (a
    `[k, 3]` tensor of left edge, right edge and count, plugin `histograms`),
    with bucket edges in log2 units, so no TensorBoard install is needed to
    write it.

    Args:
        logdir: the TensorBoard log directory.
        series: `(tag, exponents, counts)` triples; bucket `i` spans
            `[exponents[i], exponents[i] + 1)`.
        step: the summary step.
        description: optional function returning a description for a tag.
    """
    from tensorflow.core.framework import summary_pb2

    writer = tf.summary.create_file_writer(str(logdir))
    with writer.as_default():
        for tag, exponents, counts in series:
            metadata = summary_pb2.SummaryMetadata(
                display_name=tag,
                summary_description=description(tag) if description else "",
            )
            metadata.plugin_data.plugin_name = "histograms"
            buckets = np.stack(
                [
                    np.asarray(exponents, np.float64),
                    np.asarray(exponents, np.float64) + 1.0,
                    np.asarray(counts, np.float64),
                ],
                axis=1,
            )
            tf.summary.write(tag=tag, tensor=tf.constant(buckets), step=step, metadata=metadata)
    writer.flush()
    writer.close()


def read_histograms(logdir: str | os.PathLike) -> dict[str, np.ndarray]:
    """Reads back histogram summaries written by `write_histograms` (`{tag: [k, 3] array}`)."""
    from tensorflow.core.util import event_pb2

    found: dict[str, np.ndarray] = {}
    for path in sorted(tf.io.gfile.glob(os.path.join(str(logdir), "events.out.tfevents.*"))):
        for record_bytes in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(record_bytes.numpy())
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "histograms":
                    found[value.tag] = tf.make_ndarray(value.tensor)
    return found


def _write_plugin_summary(tag: str, tensor: tf.Tensor, step: int, plugin: str) -> None:
    """Writes one summary in a TensorBoard plugin's format, without needing TensorBoard."""
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata(display_name=tag)
    metadata.plugin_data.plugin_name = plugin
    tf.summary.write(tag=tag, tensor=tensor, step=step, metadata=metadata)


class SummaryWriter:
    """Writes scalars and text next to Keras' own TensorBoard logs (one event file per run).

    Args:
        logdir: the TensorBoard log directory (a sub-folder is fine).
    """

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
