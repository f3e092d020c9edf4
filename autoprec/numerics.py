"""Floating-point format facts and exponent-histogram maths.

Everything here takes plain values (floats, NumPy arrays) and returns plain
values. Format limits come from `ml_dtypes.finfo`, never from hand-typed
constants.

**The exponent histogram.** A value `x` (finite, non-zero) falls in the bin of
its binary exponent `floor(log2(|x|))`. The histogram has one bin for every
exponent a finite float32 can have, from `HISTOGRAM_MIN_EXPONENT` (-149, the
smallest float32 subnormal) to `HISTOGRAM_MAX_EXPONENT` (127): float16,
bfloat16 and float32 tensors (everything the profiler records, measured in
float32) therefore never fall outside it, so it needs no under/over bins.
Zeros and non-finite values (inf, NaN) are counted apart from the histogram.
The full range matters: bfloat16 flushes values below 2^-133 to zero, far
below the float16 range.

Every fraction below is a fraction of *all* elements of a tensor (zeros and
non-finite values included), computed exactly from the histogram. Multiplying
by a power-of-two loss scale `2^k` moves every value by exactly `k` bins, so
fractions "at a loss scale" are exact too.

Bin granularity: the histogram cannot split the top bin of a format (float16:
[32768, 65536)), so `overflow_fraction` counts values `>= 2^(max_exponent+1)`
(float16: `>= 65536`). Values in (65504, 65536) are caught by comparing the
exact maximum magnitude with the format's maximum (`exceeds_max`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import ml_dtypes
import numpy as np

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


@dataclasses.dataclass(frozen=True)
class FloatFormat:
    """Range facts of one floating-point format, taken from `ml_dtypes.finfo`.

    Attributes:
        name: `"float16"`, `"bfloat16"` or `"float32"`.
        max: largest finite value (float16: 65504).
        min_normal: smallest positive normal value (float16: 2^-14).
        min_subnormal: smallest positive subnormal value (float16: 2^-24).
        eps: distance from 1.0 to the next larger value (float16: 2^-10).
        max_exponent: `floor(log2(max))` (float16: 15).
        min_normal_exponent: `log2(min_normal)` (float16: -14).
        min_subnormal_exponent: `log2(min_subnormal)` (float16: -24).
    """

    name: str
    max: float
    min_normal: float
    min_subnormal: float
    eps: float
    max_exponent: int
    min_normal_exponent: int
    min_subnormal_exponent: int


@functools.cache
def float_format(name: str) -> FloatFormat:
    """Returns the range facts of a float format, read from `ml_dtypes.finfo`.

    Args:
        name: `"float16"`, `"bfloat16"` or `"float32"`.

    Returns:
        A `FloatFormat`.

    Example:

    >>> float_format("float16").max
    65504.0
    """
    info = ml_dtypes.finfo(name)
    maximum = float(info.max)
    min_normal = float(info.smallest_normal)
    min_subnormal = float(info.smallest_subnormal)
    return FloatFormat(
        name=name,
        max=maximum,
        min_normal=min_normal,
        min_subnormal=min_subnormal,
        eps=float(info.eps),
        max_exponent=math.frexp(maximum)[1] - 1,
        min_normal_exponent=math.frexp(min_normal)[1] - 1,
        min_subnormal_exponent=math.frexp(min_subnormal)[1] - 1,
    )


FLOAT16 = float_format("float16")
BFLOAT16 = float_format("bfloat16")
FLOAT32 = float_format("float32")

#: Exponent of the first histogram bin: the smallest float32 subnormal (-149).
HISTOGRAM_MIN_EXPONENT: int = FLOAT32.min_subnormal_exponent
#: Exponent of the last histogram bin: float32's largest exponent (127).
HISTOGRAM_MAX_EXPONENT: int = FLOAT32.max_exponent
#: Number of histogram bins (277).
HISTOGRAM_BINS: int = HISTOGRAM_MAX_EXPONENT - HISTOGRAM_MIN_EXPONENT + 1


def format_for(dtype: str | FloatFormat) -> FloatFormat:
    """Returns the `FloatFormat` for a format or a format name."""
    return dtype if isinstance(dtype, FloatFormat) else float_format(str(dtype))


def bin_exponents() -> np.ndarray:
    """Returns the exponent of every histogram bin, `[-149, ..., 127]`."""
    return np.arange(HISTOGRAM_MIN_EXPONENT, HISTOGRAM_MAX_EXPONENT + 1)


def exponent_histogram(values) -> tuple[np.ndarray, int, int]:
    """Computes the exponent histogram of `values` with NumPy (the reference implementation).

    Values are measured in float32, as the profiler does.

    Args:
        values: any array-like of numbers.

    Returns:
        `(histogram, zeros, nonfinite)`: an int64 array of `HISTOGRAM_BINS`
        counts of `floor(log2(|x|))` over finite non-zero values, the number
        of zeros and the number of infs and NaNs.

    Example:

    >>> histogram, zeros, nonfinite = exponent_histogram([0.0, 1.5, -3.0, np.inf])
    >>> histogram[0 - HISTOGRAM_MIN_EXPONENT], zeros, nonfinite
    (np.int64(1), 1, 1)
    """
    flat = np.asarray(values, dtype=np.float32).ravel()
    finite = np.isfinite(flat)
    nonzero = finite & (flat != 0)
    _, exponents = np.frexp(flat[nonzero])
    histogram = np.bincount(
        exponents.astype(np.int64) - 1 - HISTOGRAM_MIN_EXPONENT, minlength=HISTOGRAM_BINS
    ).astype(np.int64)
    zeros = int(np.count_nonzero(flat[finite] == 0))
    return histogram, zeros, int(flat.size - np.count_nonzero(finite))


def _scale_shift(scale: float) -> int:
    """Returns `k` for a power-of-two `scale = 2^k`, or raises `ValueError`."""
    mantissa, exponent = math.frexp(scale)
    if scale <= 0 or mantissa != 0.5:
        raise ValueError(f"scale must be a positive power of two, got {scale!r}")
    return exponent - 1


def _count_where(histogram: np.ndarray, mask: np.ndarray) -> int:
    return int(np.asarray(histogram, dtype=np.int64)[mask].sum())


def _fraction(part: int, count: int) -> float:
    return part / count if count else 0.0


def overflow_fraction(
    histogram: np.ndarray, count: int, dtype: str | FloatFormat = FLOAT16, scale: float = 1.0
) -> float:
    """Returns the fraction of elements that overflow `dtype` after multiplying by `scale`.

    Counts values with `|x| * scale >= 2^(max_exponent + 1)` (float16: 65536);
    see the module docstring for the top bin.

    Args:
        histogram: exponent histogram (`HISTOGRAM_BINS` counts).
        count: number of elements of the tensor (zeros and non-finite included).
        dtype: the format, e.g. `"float16"`.
        scale: a power-of-two factor applied first (a loss scale).

    Returns:
        A fraction in [0, 1].
    """
    fmt = format_for(dtype)
    exponents = bin_exponents() + _scale_shift(scale)
    return _fraction(_count_where(histogram, exponents > fmt.max_exponent), count)


def underflow_fraction(
    histogram: np.ndarray, count: int, dtype: str | FloatFormat = FLOAT16, scale: float = 1.0
) -> float:
    """Returns the fraction of elements that flush to zero in `dtype` after scaling.

    Counts non-zero values with `|x| * scale < min_subnormal` (float16: 2^-24).

    Args:
        histogram: exponent histogram (`HISTOGRAM_BINS` counts).
        count: number of elements of the tensor.
        dtype: the format.
        scale: a power-of-two factor applied first (a loss scale).

    Returns:
        A fraction in [0, 1].
    """
    fmt = format_for(dtype)
    exponents = bin_exponents() + _scale_shift(scale)
    return _fraction(_count_where(histogram, exponents < fmt.min_subnormal_exponent), count)


def subnormal_fraction(
    histogram: np.ndarray, count: int, dtype: str | FloatFormat = FLOAT16, scale: float = 1.0
) -> float:
    """Returns the fraction of elements in `dtype`'s subnormal range after scaling.

    Counts values with `min_subnormal <= |x| * scale < min_normal` (float16:
    2^-24 to 2^-14), which keep fewer significant bits.

    Args:
        histogram: exponent histogram (`HISTOGRAM_BINS` counts).
        count: number of elements of the tensor.
        dtype: the format.
        scale: a power-of-two factor applied first (a loss scale).

    Returns:
        A fraction in [0, 1].
    """
    fmt = format_for(dtype)
    exponents = bin_exponents() + _scale_shift(scale)
    in_range = (exponents >= fmt.min_subnormal_exponent) & (exponents < fmt.min_normal_exponent)
    return _fraction(_count_where(histogram, in_range), count)


def exceeds_max(max_abs: float, dtype: str | FloatFormat = FLOAT16, scale: float = 1.0) -> bool:
    """Returns whether `max_abs * scale` is above the largest finite value of `dtype`."""
    return max_abs * scale > format_for(dtype).max


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
