"""Loss-scale maths: headroom below a format's max and the power-of-two scales that fit gradients.

Every function takes an exponent histogram (see `histogram`) or a largest
magnitude and returns plain values.
"""

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
    """Returns `log2(max / max_abs)`: how many doublings `max_abs` can take before overflow.

    Args:
        max_abs: largest finite magnitude of a tensor.
        dtype: the format.

    Returns:
        Bits of headroom; negative when `max_abs` already overflows, `inf` for
        an all-zero tensor.
    """
    if max_abs <= 0:
        return math.inf
    return math.log2(format_for(dtype).max / max_abs)


def suggested_loss_scale(
    max_abs: float,
    dtype: str | FloatFormat = FLOAT16,
    margin_bits: int = LOSS_SCALE_MARGIN_BITS,
) -> float:
    """Returns the largest power-of-two loss scale that keeps gradients below `dtype`'s max.

    The scale `2^k` is the largest with `max_abs * 2^k * 2^margin_bits <= max`,
    clipped to [`MIN_LOSS_SCALE`, `MAX_LOSS_SCALE`].

    Args:
        max_abs: largest finite gradient magnitude (unscaled).
        dtype: the format the gradients are computed in.
        margin_bits: bits kept free below the maximum.

    Returns:
        A power of two.

    Example:

    >>> suggested_loss_scale(1.0)  # 65504 / 2 = 32752 -> 2^14
    16384.0
    """
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
    """Returns the lowest exponent below which at most `tolerance` of non-zero values lie.

    Args:
        histogram: exponent histogram (`HISTOGRAM_BINS` counts).
        tolerance: fraction of finite non-zero values allowed below the result.

    Returns:
        An exponent `e` (values from `2^e` up count as significant), or `None`
        for a histogram without values.
    """
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
    """Returns the smallest power-of-two scale that lifts significant values above flush-to-zero.

    Args:
        histogram: exponent histogram of gradients.
        dtype: the format.
        tolerance: see `smallest_significant_exponent`.

    Returns:
        A power of two (1.0 or less when nothing would underflow).
    """
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
    """Returns whether one loss scale fits both ends of the gradient range in `dtype`.

    True when, at `suggested_loss_scale(max_abs)`, at most `tolerance` of the
    elements flush to zero (so the largest gradients stay below the maximum
    with margin *and* the small significant ones become representable).

    Args:
        histogram: exponent histogram of the (unscaled) gradients.
        count: number of elements.
        max_abs: largest finite gradient magnitude.
        dtype: the format.
        tolerance: fraction of elements allowed to flush to zero.

    Returns:
        Whether such a scale exists.
    """
    scale = suggested_loss_scale(max_abs, dtype)
    return underflow_fraction(histogram, count, dtype, scale) <= tolerance
