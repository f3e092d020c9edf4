"""TensorFlow side of the profiler's measurement: the raw statistics of one tensor, in-graph."""

from __future__ import annotations

import functools
from collections.abc import Callable

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


def _count_values(indices: tf.Tensor, slots: int, xla: bool) -> tf.Tensor:
    """Counts occurrences of each integer in `[0, slots)` (int32 result)."""
    if xla:
        return tf.math.unsorted_segment_sum(tf.ones_like(indices), indices, slots)
    return tf.raw_ops.DenseBincount(
        input=indices, size=slots, weights=tf.zeros([0], tf.int32), binary_output=False
    )


def _sum_of_squares(values: tf.Tensor) -> tf.Tensor:
    """Sum of squares of a 1-D float32 tensor in one pass (`L2Loss` is half of it)."""
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
    """Raw statistics of a 1-D float32 tensor: int64 counts and float64 `FLOAT_SLOTS`."""
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


def combine_floats(current: tf.Tensor, new: tf.Tensor) -> tf.Tensor:
    """Accumulates float slots (last axis): max of maxima, min of minima, sums of sums."""
    return tf.where(
        _COMBINE_BY_MAX,
        tf.maximum(current, new),
        tf.where(_COMBINE_BY_MIN, tf.minimum(current, new), current + new),
    )


@functools.cache
def _statistics_function(xla: bool) -> Callable:
    """Returns a `tf.function` computing `(counts, floats)` of a 1-D tensor, traced once."""

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
    """Computes the raw statistics of one tensor (see the module docstring)."""
    return _statistics_function(xla)(_flatten(tensor, multiplier))


def _flatten(tensor: tf.Tensor, multiplier: tf.Tensor | None) -> tf.Tensor:
    """`tensor` as a 1-D float32 tensor without gradient, times `multiplier` if given."""
    flat = tf.reshape(tf.stop_gradient(tensor), [-1])
    if flat.dtype != tf.float32:
        flat = tf.cast(flat, tf.float32)
    if multiplier is not None:
        flat = flat * tf.cast(multiplier, tf.float32)
    return flat
