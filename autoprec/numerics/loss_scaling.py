"""Loss-scale maths: headroom below a format's max and the power-of-two scales that fit gradients."""

from __future__ import annotations

import math

import numpy as np

from .formats import FLOAT16, FloatFormat, format_for
from .histogram import bin_exponents, underflow_fraction

#: Largest loss scale ever suggested (2^24, far above Keras' initial 2^15).
MAX_LOSS_SCALE = 2.0**24

#: Smallest loss scale ever suggested (for gradients that overflow float16 at scale 1).
MIN_LOSS_SCALE = 2.0**-24

#: Bits of headroom a suggested loss scale keeps below the format's maximum:
#: 1 bit means the largest scaled gradient stays below half of float16's max.
LOSS_SCALE_MARGIN_BITS = 1

#: Fraction of a tensor's elements that may flush to zero before the tensor
#: counts as not fitting a format (also the quantile that defines the
#: "smallest significant" gradient magnitude).
UNDERFLOW_TOLERANCE = 1e-3


def headroom_bits(max_abs: float, dtype: str | FloatFormat = FLOAT16) -> float:
    """Returns `log2(max / max_abs)`: how many doublings `max_abs` can take before overflow."""
    if max_abs <= 0:
        return math.inf
    return math.log2(format_for(dtype).max / max_abs)


def suggested_loss_scale(
    max_abs: float,
    dtype: str | FloatFormat = FLOAT16,
    margin_bits: int = LOSS_SCALE_MARGIN_BITS,
) -> float:
    """Returns the largest power-of-two loss scale that keeps gradients below `dtype`'s max."""
    if not max_abs > 0 or not math.isfinite(max_abs):
        return MAX_LOSS_SCALE if max_abs == 0 else MIN_LOSS_SCALE
    maximum = format_for(dtype).max

    def fits(exponent: int) -> bool:
        return max_abs * 2.0 ** (exponent + margin_bits) <= maximum

    exponent = math.floor(math.log2(maximum / max_abs)) - margin_bits
    while not fits(exponent):
        exponent -= 1
    while fits(exponent + 1):
        exponent += 1
    return float(min(MAX_LOSS_SCALE, max(MIN_LOSS_SCALE, 2.0**exponent)))


def smallest_significant_exponent(
    histogram: np.ndarray, tolerance: float = UNDERFLOW_TOLERANCE
) -> int | None:
    """Returns the lowest exponent below which at most `tolerance` of non-zero values lie."""
    counts = np.asarray(histogram, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return None
    below = np.cumsum(counts) - counts
    allowed = tolerance * total
    significant = np.nonzero((below <= allowed) & (counts > 0))[0]
    return int(bin_exponents()[significant[-1]])


def required_loss_scale(
    histogram: np.ndarray,
    dtype: str | FloatFormat = FLOAT16,
    tolerance: float = UNDERFLOW_TOLERANCE,
) -> float:
    """Returns the smallest power-of-two scale that lifts significant values above flush-to-zero."""
    exponent = smallest_significant_exponent(histogram, tolerance)
    if exponent is None:
        return 1.0
    return 2.0 ** (format_for(dtype).min_subnormal_exponent - exponent)


def loss_scale_covers_range(
    histogram: np.ndarray,
    count: int,
    max_abs: float,
    dtype: str | FloatFormat = FLOAT16,
    tolerance: float = UNDERFLOW_TOLERANCE,
) -> bool:
    """Returns whether one loss scale fits both ends of the gradient range in `dtype`."""
    scale = suggested_loss_scale(max_abs, dtype)
    return underflow_fraction(histogram, count, dtype, scale) <= tolerance
