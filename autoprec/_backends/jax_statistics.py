"""JAX side of the profiler's measurement: one tensor's raw statistics, and their totals on the
host."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_MANTISSA_BITS = 23
_BIASED_EXPONENT_BINS = 256
_SUBNORMAL_EXPONENTS = 23
_SMALLEST_NORMAL_BITS = 1 << _MANTISSA_BITS
_INFINITY_BITS = 0x7F800000
_FLOAT32_EXPONENT_BIAS = 127
_NONFINITE_BIN = 255
_NAN_SLOT = 279

#: Length of the raw count vector, as on TensorFlow: 256 biased-exponent slots
#: (slot 0 the zeros, slot 255 the non-finite values), 23 float32 subnormal
#: exponents (-149 .. -127), then the NaNs among the non-finite values.
RAW_COUNT_SLOTS = _BIASED_EXPONENT_BINS + _SUBNORMAL_EXPONENTS + 1
#: Order of the float32 values one measurement returns: the sums are of values
#: divided by `2**scale_exponent`.
STEP_FLOAT_SLOTS = ("max_abs", "min_nonzero_abs", "sum_abs", "sum_squares", "scale_exponent")


def _power_of_two(exponent: jax.Array) -> jax.Array:
    """`2.0**exponent` in float32, exactly, for integer exponents in [-126, 127] (built from bits)."""
    biased = (exponent.astype(jnp.int32) + _FLOAT32_EXPONENT_BIAS) << _MANTISSA_BITS
    return lax.bitcast_convert_type(biased, jnp.float32)


def _flat_statistics(flat: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Raw statistics of a 1-D float32 array: int32 counts and float32 `STEP_FLOAT_SLOTS`."""
    magnitude = jnp.abs(flat)
    bits = lax.bitcast_convert_type(magnitude, jnp.int32)
    # A subnormal |x| is m * 2^-149 with integer m < 2^23: floor(log2(m)) is the
    # biased exponent of float32(m) (exact) minus the bias.
    is_subnormal = (bits > 0) & (bits < _SMALLEST_NORMAL_BITS)
    mantissa_exponent = (
        lax.bitcast_convert_type(bits.astype(jnp.float32), jnp.int32) >> _MANTISSA_BITS
    ) - _FLOAT32_EXPONENT_BIAS
    slots = jnp.where(
        is_subnormal,
        _BIASED_EXPONENT_BINS + mantissa_exponent,
        jnp.where(bits > _INFINITY_BITS, _NAN_SLOT, bits >> _MANTISSA_BITS),
    )
    counts = jnp.zeros((RAW_COUNT_SLOTS,), jnp.int32).at[slots].add(1, mode="promise_in_bounds")
    counts = counts.at[_NONFINITE_BIN].add(counts[_NAN_SLOT])  # slot 255 counts inf and NaN
    finite = jnp.where(bits < _INFINITY_BITS, magnitude, jnp.float32(0.0))
    # Zeros wrap to the largest unsigned value, so the minimum is the smallest non-zero.
    shifted_bits = lax.bitcast_convert_type(bits, jnp.uint32) - jnp.uint32(1)
    largest, smallest_shifted = lax.reduce(
        (finite, shifted_bits),
        (np.float32(0.0), np.uint32(0xFFFFFFFF)),
        lambda a, b: (jnp.maximum(a[0], b[0]), jnp.minimum(a[1], b[1])),
        (0,),
    )
    smallest_bits = smallest_shifted + jnp.uint32(1)
    min_nonzero = jnp.where(
        (smallest_bits > 0) & (smallest_bits < _INFINITY_BITS),
        lax.bitcast_convert_type(smallest_bits, jnp.float32),
        jnp.float32(np.inf),
    )
    exponent = jnp.where(
        largest > 0,
        (lax.bitcast_convert_type(largest, jnp.int32) >> _MANTISSA_BITS) - _FLOAT32_EXPONENT_BIAS,
        0,
    )
    # Two exact power-of-two factors applied one after the other: each is a normal
    # float32 whatever the exponent (their product may not be).
    half = exponent // 2
    scaled = finite * _power_of_two(-half) * _power_of_two(half - exponent)
    sum_abs, sum_squares = lax.reduce(
        (scaled, scaled * scaled),
        (np.float32(0.0), np.float32(0.0)),
        lambda a, b: (a[0] + b[0], a[1] + b[1]),
        (0,),
    )
    floats = jnp.stack([largest, min_nonzero, sum_abs, sum_squares, exponent.astype(jnp.float32)])
    return counts, floats


def tensor_statistics(tensor: Any, multiplier: Any = None) -> tuple[jax.Array, jax.Array]:
    """Computes one tensor's raw statistics, inside a traced step or eagerly."""
    flat = jnp.ravel(lax.stop_gradient(jnp.asarray(tensor))).astype(jnp.float32)
    if multiplier is not None:
        flat = flat * jnp.asarray(multiplier, jnp.float32)
    return _flat_statistics(flat)


def host_statistics(counts: np.ndarray, floats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Adds up measurements (rows of `tensor_statistics`) into int64 counts and float64 floats."""
    counts = np.asarray(counts, np.int64).reshape(-1, RAW_COUNT_SLOTS)
    floats = np.asarray(floats, np.float64).reshape(-1, len(STEP_FLOAT_SLOTS))
    live = counts.sum(axis=1) > 0
    total = counts.sum(axis=0)
    floats = floats[live]
    if not floats.shape[0]:
        return total, empty_totals()[1]
    scale = np.exp2(floats[:, 4])
    return total, np.array(
        [
            floats[:, 0].max(),
            floats[:, 1].min(),
            float(np.sum(floats[:, 2] * scale)),
            float(np.sum(floats[:, 3] * scale * scale)),
        ]
    )


def empty_totals() -> tuple[np.ndarray, np.ndarray]:
    """Returns the totals of a slot that measured nothing yet."""
    return np.zeros(RAW_COUNT_SLOTS, np.int64), np.array([0.0, np.inf, 0.0, 0.0])


def combine_totals(
    totals: Iterable[tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray]:
    """Adds host totals of one slot: counts and sums add, maxima and minima combine."""
    items = list(totals)
    counts = np.sum([counts for counts, _ in items], axis=0)
    floats = np.stack([floats for _, floats in items])
    return counts, np.array(
        [floats[:, 0].max(), floats[:, 1].min(), floats[:, 2].sum(), floats[:, 3].sum()]
    )
