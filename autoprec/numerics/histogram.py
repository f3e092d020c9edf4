"""Exponent-histogram maths: the histogram of a tensor and the fractions that over- or underflow.

Everything here takes plain values (floats, NumPy arrays) and returns plain
values.

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

import math

import numpy as np
from numpy.typing import ArrayLike

from .formats import FLOAT16, FLOAT32, FloatFormat, format_for

#: Exponent of the first histogram bin: the smallest float32 subnormal (-149).
HISTOGRAM_MIN_EXPONENT: int = FLOAT32.min_subnormal_exponent
#: Exponent of the last histogram bin: float32's largest exponent (127).
HISTOGRAM_MAX_EXPONENT: int = FLOAT32.max_exponent
#: Number of histogram bins (277).
HISTOGRAM_BINS: int = HISTOGRAM_MAX_EXPONENT - HISTOGRAM_MIN_EXPONENT + 1


def bin_exponents() -> np.ndarray:
    """Returns the exponent of every histogram bin, `[-149, ..., 127]`.

    Returns:
        An int array of `HISTOGRAM_BINS` exponents, bin `i` holding `2^e` to `2^(e+1)`.

    Example:

    >>> int(bin_exponents()[0]), int(bin_exponents()[-1])
    (-149, 127)
    """
    return np.arange(HISTOGRAM_MIN_EXPONENT, HISTOGRAM_MAX_EXPONENT + 1)


def exponent_histogram(values: ArrayLike) -> tuple[np.ndarray, int, int]:
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
    """Returns whether `max_abs * scale` is above the largest finite value of `dtype`.

    Args:
        max_abs: largest finite magnitude of a tensor.
        dtype: the format.
        scale: a factor applied first (a loss scale).

    Returns:
        Whether the scaled magnitude overflows the format.

    Example:

    >>> exceeds_max(65505.0), exceeds_max(65504.0)
    (True, False)
    """
    return max_abs * scale > format_for(dtype).max
