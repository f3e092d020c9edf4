"""Float8 under per-tensor scaling: the values Keras' scaled float8 cast flushes or clips."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .formats import FLOAT8_E4M3, FloatFormat, format_for
from .histogram import bin_exponents

#: Steps by which Keras' float8 scale lags the amax: the scale a step uses was
#: computed, one step earlier, from the amax history of the steps before that,
#: so step `t` is scaled by the largest amax of steps `<= t - 2`.
FLOAT8_SCALE_DELAY_STEPS = 2

#: Earlier steps a step's amax is compared with before it is judged: the first
#: steps of a profile only fill the history (in training it holds up to 1024
#: steps), as against too few steps a batch-to-batch swing looks like growth.
FLOAT8_MIN_HISTORY_STEPS = 3

#: Fraction of a tensor's non-zero values that may round to zero in float8
#: after per-tensor scaling before the layer counts as unsafe for float8.
FLOAT8_FLUSH_TOLERANCE = 1e-2

#: Fraction of a tensor's non-zero values that may be clipped to the format's
#: max by Keras' delayed scale (by more than the format's own spacing).
FLOAT8_SATURATION_TOLERANCE = 1e-3

#: Largest factor a tensor's amax may grow by from one step to the next: above
#: 2, the largest values of such a step are clipped to less than half their
#: size, whatever their number, since the scale comes from earlier steps.
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
    with np.errstate(divide="ignore"):
        logs = np.where(counts > 0, np.log2(np.maximum(counts, 1.0)), -np.inf)
    below = np.concatenate([[-np.inf], logs[:-1]])
    above = np.concatenate([logs[1:], [-np.inf]])
    has_below, has_above = np.isfinite(below), np.isfinite(above)
    here = np.where(np.isfinite(logs), logs, 0.0)
    slopes = np.zeros_like(counts)
    both = has_below & has_above
    slopes[both] = (above[both] - below[both]) / 2
    only_below = has_below & ~has_above
    slopes[only_below] = here[only_below] - below[only_below]
    only_above = has_above & ~has_below
    slopes[only_above] = above[only_above] - here[only_above]
    return slopes


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
    """Returns the fraction of non-zero values that round to zero in float8 after per-tensor
    scaling."""
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
    ratios = []
    largest = 0.0
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
    """Returns the fraction of non-zero values Keras' delayed float8 scale clips to the format's
    max."""
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
