"""Exponent-histogram maths: the histogram of a tensor and the fractions that over- or underflow."""

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
    """Returns the exponent of every histogram bin, `[-149, ..., 127]`."""
    return np.arange(HISTOGRAM_MIN_EXPONENT, HISTOGRAM_MAX_EXPONENT + 1)


def exponent_histogram(values: ArrayLike) -> tuple[np.ndarray, int, int]:
    """Computes the exponent histogram of `values` with NumPy (the reference implementation)."""
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
    """Returns the fraction of elements that overflow `dtype` after multiplying by `scale`."""
    fmt = format_for(dtype)
    exponents = bin_exponents() + _scale_shift(scale)
    return _fraction(_count_where(histogram, exponents > fmt.max_exponent), count)


def underflow_fraction(
    histogram: np.ndarray, count: int, dtype: str | FloatFormat = FLOAT16, scale: float = 1.0
) -> float:
    """Returns the fraction of elements that flush to zero in `dtype` after scaling."""
    fmt = format_for(dtype)
    exponents = bin_exponents() + _scale_shift(scale)
    return _fraction(_count_where(histogram, exponents < fmt.min_subnormal_exponent), count)


def subnormal_fraction(
    histogram: np.ndarray, count: int, dtype: str | FloatFormat = FLOAT16, scale: float = 1.0
) -> float:
    """Returns the fraction of elements in `dtype`'s subnormal range after scaling."""
    fmt = format_for(dtype)
    exponents = bin_exponents() + _scale_shift(scale)
    in_range = (exponents >= fmt.min_subnormal_exponent) & (exponents < fmt.min_normal_exponent)
    return _fraction(_count_where(histogram, in_range), count)


def exceeds_max(max_abs: float, dtype: str | FloatFormat = FLOAT16, scale: float = 1.0) -> bool:
    """Returns whether `max_abs * scale` is above the largest finite value of `dtype`."""
    return max_abs * scale > format_for(dtype).max
