"""Floating-point format facts (from `ml_dtypes.finfo`), exponent-histogram maths, loss-scale and
float8-scale maths."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import ml_dtypes
import numpy as np
from numpy.typing import ArrayLike

#: Other names accepted for formats: the float8 names Keras' float8 path uses.
FORMAT_ALIASES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


@dataclasses.dataclass(frozen=True)
class FloatFormat:
    """Range facts of one floating-point format, taken from `ml_dtypes.finfo`."""

    name: str
    max: float
    min_normal: float
    min_subnormal: float
    eps: float
    max_exponent: int
    min_normal_exponent: int
    min_subnormal_exponent: int
    mantissa_bits: int


@functools.cache
def float_format(name: str) -> FloatFormat:
    """Returns the range facts of a float format, read from `ml_dtypes.finfo`."""
    name = FORMAT_ALIASES.get(name, name)
    info = ml_dtypes.finfo(name)
    limits = [float(info.max), float(info.smallest_normal), float(info.smallest_subnormal)]
    exponents = [math.frexp(limit)[1] - 1 for limit in limits]  # max, min normal, min subnormal
    return FloatFormat(name, *limits, float(info.eps), *exponents, int(info.nmant))


FLOAT16 = float_format("float16")
BFLOAT16 = float_format("bfloat16")
FLOAT32 = float_format("float32")
#: Keras' float8 format of inputs and kernels: max 448, smallest subnormal 2^-9.
FLOAT8_E4M3 = float_format("float8_e4m3fn")
#: Keras' float8 format of output gradients: max 57344, smallest subnormal 2^-16.
FLOAT8_E5M2 = float_format("float8_e5m2")


def format_for(dtype: str | FloatFormat | np.dtype | type) -> FloatFormat:
    """Returns the `FloatFormat` for a format, a format name (`"e4m3"` too) or a NumPy dtype."""
    if isinstance(dtype, FloatFormat):
        return dtype
    if isinstance(dtype, str):
        return float_format(dtype)
    try:
        return float_format(np.dtype(dtype).name)
    except TypeError:
        return float_format(str(dtype))


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


def _scaled_exponents(scale: float) -> np.ndarray:
    """Each bin's exponent after multiplying by a power-of-two `scale` (else `ValueError`)."""
    if scale <= 0 or math.frexp(scale)[0] != 0.5:
        raise ValueError(f"scale must be a positive power of two, got {scale!r}")
    return bin_exponents() + math.frexp(scale)[1] - 1


def _fraction(histogram: np.ndarray, count: int, mask: np.ndarray) -> float:
    return int(np.asarray(histogram, dtype=np.int64)[mask].sum()) / count if count else 0.0


def overflow_fraction(
    histogram: np.ndarray, count: int, dtype: str | FloatFormat = FLOAT16, scale: float = 1.0
) -> float:
    """Returns the fraction of elements that overflow `dtype` after multiplying by `scale`."""
    return _fraction(histogram, count, _scaled_exponents(scale) > format_for(dtype).max_exponent)


def underflow_fraction(
    histogram: np.ndarray, count: int, dtype: str | FloatFormat = FLOAT16, scale: float = 1.0
) -> float:
    """Returns the fraction of elements that flush to zero in `dtype` after scaling."""
    minimum = format_for(dtype).min_subnormal_exponent
    return _fraction(histogram, count, _scaled_exponents(scale) < minimum)


def subnormal_fraction(
    histogram: np.ndarray, count: int, dtype: str | FloatFormat = FLOAT16, scale: float = 1.0
) -> float:
    """Returns the fraction of elements in `dtype`'s subnormal range after scaling."""
    fmt = format_for(dtype)
    exponents = _scaled_exponents(scale)
    in_range = (exponents >= fmt.min_subnormal_exponent) & (exponents < fmt.min_normal_exponent)
    return _fraction(histogram, count, in_range)


def exceeds_max(max_abs: float, dtype: str | FloatFormat = FLOAT16, scale: float = 1.0) -> bool:
    """Returns whether `max_abs * scale` is above the largest finite value of `dtype`."""
    return max_abs * scale > format_for(dtype).max


#: Largest loss scale ever suggested (2^24, far above Keras' initial 2^15).
MAX_LOSS_SCALE = 2.0**24
#: Smallest loss scale ever suggested (for gradients that overflow float16 at scale 1).
MIN_LOSS_SCALE = 2.0**-24
#: Bits of headroom a suggested loss scale keeps below the format's maximum (1: under half of it).
LOSS_SCALE_MARGIN_BITS = 1
#: Fraction of a tensor's elements that may flush to zero before it does not fit a format (also
#: the quantile that defines the "smallest significant" gradient magnitude).
UNDERFLOW_TOLERANCE = 1e-3


def headroom_bits(max_abs: float, dtype: str | FloatFormat = FLOAT16) -> float:
    """Returns `log2(max / max_abs)`: how many doublings `max_abs` can take before overflow."""
    if max_abs <= 0:
        return math.inf
    return math.log2(format_for(dtype).max / max_abs)


def suggested_loss_scale(
    max_abs: float, dtype: str | FloatFormat = FLOAT16, margin_bits: int = LOSS_SCALE_MARGIN_BITS
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


#: Steps by which Keras' float8 scale lags the amax: step `t` is scaled by the largest amax of
#: steps `<= t - 2` (the scale was computed a step earlier from the history before it).
FLOAT8_SCALE_DELAY_STEPS = 2
#: Earlier steps a step's amax is compared with before it is judged (against fewer, a
#: batch-to-batch swing looks like growth).
FLOAT8_MIN_HISTORY_STEPS = 3
#: Fraction of a tensor's non-zero values that may round to zero in float8 after scaling.
FLOAT8_FLUSH_TOLERANCE = 1e-2
#: Fraction that Keras' delayed scale may clip to the format's max (beyond its own spacing).
FLOAT8_SATURATION_TOLERANCE = 1e-3
#: Largest factor an amax may grow by in one step: above 2, that step's largest values are
#: clipped to less than half their size, since the scale comes from earlier steps.
FLOAT8_MAX_AMAX_GROWTH = 2.0


def _bin_bounds(low: float | None, high: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Returns each bin's `[lower, upper)` edges, narrowed to `[low, high]` where given."""
    exponents = bin_exponents().astype(np.float64)
    lower, upper = np.exp2(exponents), np.exp2(exponents + 1)
    if high is not None and high > 0:
        upper = np.minimum(upper, high)
    if low is not None and low > 0:
        lower = np.maximum(lower, low)
    return np.minimum(lower, upper), upper


def _octave_slopes(counts: np.ndarray) -> np.ndarray:
    """Returns each bin's local slope `b` of `log2(count)` per octave, from its neighbours."""
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(counts > 0, np.log2(np.maximum(counts, 1.0)), -np.inf)
        below = np.concatenate([[-np.inf], logs[:-1]])
        above = np.concatenate([logs[1:], [-np.inf]])
        has_below, has_above = np.isfinite(below), np.isfinite(above)
        here = np.where(np.isfinite(logs), logs, 0.0)
        slopes = [(above - below) / 2, here - below, above - here]
        return np.select([has_below & has_above, has_below, has_above], slopes, 0.0)


def _share_below(offset: np.ndarray, width: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """Share of a bin's mass below `offset` octaves from its lower edge, density `2^(slope u)`."""
    flat = np.abs(slope * width) < 1e-9
    safe = np.where(flat, 1.0, slope)
    curved = np.expm1(safe * offset * math.log(2)) / np.expm1(safe * width * math.log(2))
    return np.where(flat, offset / np.where(width > 0, width, 1.0), curved)


def _count_below(
    histogram: np.ndarray, threshold: float, low: float | None = None, high: float | None = None
) -> float:
    """Returns how many histogram values lie below `threshold` (the straddling bin estimated)."""
    counts = np.asarray(histogram, dtype=np.float64)
    lower, upper = _bin_bounds(low, high)
    share = np.where(upper <= threshold, 1.0, 0.0)
    straddles = (lower < threshold) & (threshold < upper) & (counts > 0)
    if straddles.any():
        offset = np.log2(threshold / lower[straddles])
        width = np.log2(upper[straddles] / lower[straddles])
        slopes = _octave_slopes(counts)[straddles]
        share[straddles] = _share_below(offset, width, slopes)
    return float(np.sum(counts * share))


def float8_scale(amax: float, dtype: str | FloatFormat = FLOAT8_E4M3) -> float:
    """Returns the factor Keras multiplies a tensor by before casting it to float8: `max / amax`."""
    if not amax > 0 or not math.isfinite(amax):
        return 1.0
    return format_for(dtype).max / amax


def float8_flush_fraction(
    histogram: np.ndarray,
    amax: float,
    dtype: str | FloatFormat = FLOAT8_E4M3,
    min_abs: float | None = None,
) -> float:
    """Returns the fraction of non-zero values that round to zero in float8 after per-tensor scaling."""
    counts = np.asarray(histogram, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return 0.0
    fmt = format_for(dtype)
    threshold = fmt.min_subnormal / 2 / float8_scale(amax, fmt)
    return _count_below(counts, threshold, low=min_abs, high=amax) / total


def float8_saturation_fraction(
    histogram: np.ndarray,
    scale_amax: float,
    amax: float | None = None,
    min_abs: float | None = None,
    clip_tolerance: float = 0.0,
) -> float:
    """Returns the fraction of non-zero values above float8's max after scaling by `scale_amax`."""
    if not scale_amax > 0 or not math.isfinite(scale_amax):
        raise ValueError(f"scale_amax must be a positive finite number, got {scale_amax!r}")
    counts = np.asarray(histogram, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return 0.0
    threshold = scale_amax * (1.0 + clip_tolerance)
    kept = _count_below(counts, threshold, low=min_abs, high=amax)
    return max(0.0, total - kept) / total


def amax_growth(step_amax: Sequence[float], min_history: int = 1) -> float | None:
    """Returns the largest factor by which a step's amax exceeded the amax of every earlier step."""
    ratios, largest = [], 0.0
    for step, value in enumerate(step_amax):
        if not math.isfinite(value):
            continue
        if largest > 0 and step >= min_history:
            ratios.append(value / largest)
        largest = max(largest, value)
    return max(ratios) if ratios else None


def float8_delayed_saturation_fraction(
    step_histograms: Sequence[np.ndarray],
    step_amax: Sequence[float],
    delay: int = FLOAT8_SCALE_DELAY_STEPS,
    clip_tolerance: float = 0.0,
    min_history: int = 1,
) -> float | None:
    """Returns the fraction of non-zero values that Keras' delayed float8 scale clips to its max."""
    if delay < 1:
        raise ValueError(f"delay must be at least 1, got {delay!r}")
    judged, values, clipped = False, 0, 0.0
    for step in range(delay + max(1, min_history) - 1, len(step_histograms)):
        history = max(step_amax[: step - delay + 1])
        if not history > 0 or not math.isfinite(history):
            continue
        counts = np.asarray(step_histograms[step], dtype=np.int64)
        total = int(counts.sum())
        judged, values = True, values + total
        if total:
            fraction = float8_saturation_fraction(
                counts, history, amax=step_amax[step], clip_tolerance=clip_tolerance
            )
            clipped += fraction * total
    if not judged:
        return None
    return clipped / values if values else 0.0
