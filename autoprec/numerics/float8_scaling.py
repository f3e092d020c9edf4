"""Float8 under per-tensor scaling: the values Keras' scaled float8 cast flushes or clips.

Keras' float8 path (`Dense` and
`EinsumDense` under a `float8_from_*` policy) multiplies a tensor by
`format max / amax` before casting it to E4M3 (inputs, kernel) or E5M2
(output gradients), with the amax taken from a history of earlier steps
(margin 0). Its threshold is then no power of two, so the one histogram bin
that straddles it is split by a power law fitted to its neighbouring bins'
counts (between the bin's edges, narrowed to the tensor's smallest and
largest magnitudes where those fall inside it): those fractions are
estimates, exact when the threshold is a power of two and otherwise off by
at most that one bin's share. They are fractions of the finite
*non-zero* values (zeros stay exact in float8).
"""

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
    """Returns each bin's local slope `b` of `log2(count)` per octave, from its neighbours.

    The central difference of the neighbouring bins where both hold values,
    a one-sided difference where one does, 0 (log-uniform) where none does.
    """
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
    """Returns how many histogram values lie below `threshold` (the straddling bin estimated).

    Inside the bin that straddles the threshold, the values are taken to
    follow the power law that the neighbouring bins' counts suggest (a
    density `2^(b u)` in `u = log2|x|`, `b` from `_octave_slopes`): flat in
    `|x|` near zero for a density that crosses zero, decaying in a tail.
    """
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
    """Returns the factor Keras multiplies a tensor by before casting it to float8: `max / amax`.

    This is `1 / keras.quantizers.compute_float8_scale(amax, ...)` with margin 0.
    Keras keeps the previous scale when the amax is 0 or not finite; without
    one, this returns 1.0 then.

    Args:
        amax: the amax the scale is computed from.
        dtype: the float8 format (`"float8_e4m3fn"` or `"float8_e5m2"`).

    Returns:
        A positive factor.

    Example:

    >>> float8_scale(2.0, "e4m3")
    224.0
    """
    if not amax > 0 or not math.isfinite(amax):
        return 1.0
    return format_for(dtype).max / amax


def float8_flush_fraction(
    histogram: np.ndarray,
    amax: float,
    dtype: str | FloatFormat = FLOAT8_E4M3,
    min_abs: float | None = None,
) -> float:
    """Returns the fraction of non-zero values that round to zero in float8 after per-tensor scaling.

    The tensor is multiplied by `float8_scale(amax, dtype)` as Keras does;
    a value rounds to zero when its scaled magnitude is below half the
    format's smallest subnormal (E4M3: 2^-10, E5M2: 2^-17). See the module
    docstring for the straddling bin.

    Args:
        histogram: exponent histogram (`HISTOGRAM_BINS` counts).
        amax: the amax the scale is computed from (the tensor's largest magnitude).
        dtype: the float8 format.
        min_abs: the tensor's smallest non-zero magnitude, when known (sharpens the estimate).

    Returns:
        A fraction of the finite non-zero values, in [0, 1].

    Example:

    >>> from autoprec.numerics.histogram import exponent_histogram
    >>> histogram, _, _ = exponent_histogram([448.0, 1.0, 2.0**-11, 2.0**-12])
    >>> float8_flush_fraction(histogram, 448.0, "e4m3")
    0.5
    """
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
    """Returns the fraction of non-zero values above float8's max after scaling by `scale_amax`.

    Scaled by `max / scale_amax`, a value exceeds the format's max (and Keras
    clips it there) exactly when `|x| > scale_amax`, whichever the format:
    this happens when the scale comes from an amax smaller than the tensor's
    own, as with Keras' delayed scaling when the amax grows.

    Args:
        histogram: exponent histogram (`HISTOGRAM_BINS` counts).
        scale_amax: the (positive) amax the scale was computed from.
        amax: the tensor's own largest magnitude, when known (sharpens the estimate).
        min_abs: the tensor's smallest non-zero magnitude, when known.
        clip_tolerance: count only values clipped by more than this relative
            amount (`|x| > scale_amax * (1 + clip_tolerance)`).

    Returns:
        A fraction of the finite non-zero values, in [0, 1].

    Raises:
        ValueError: if `scale_amax` is not a positive finite number.

    Example:

    >>> from autoprec.numerics.histogram import exponent_histogram
    >>> histogram, _, _ = exponent_histogram([1.0, 2.0, 3.0, 8.0])
    >>> float8_saturation_fraction(histogram, scale_amax=4.0, amax=8.0)
    0.25
    """
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
    """Returns the largest factor by which a step's amax exceeded the amax of every earlier step.

    Args:
        step_amax: the amax of each step in order (or, as the profiler keeps
            them, the running maximum after each step: the same result).
        min_history: judge only steps with at least this many earlier steps.

    Returns:
        The largest `step_amax[t] / max(step_amax[:t])` over the judged steps
        with an earlier positive amax (at most 1.0 when the amax never grew),
        or `None` when there is no such step.

    Example:

    >>> amax_growth([1.0, 1.5, 1.2, 6.0])
    4.0
    >>> amax_growth([1.0, 3.0, 3.0], min_history=2)
    1.0
    """
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
    """Returns the fraction of non-zero values Keras' delayed float8 scale clips to the format's max.

    Step `t` is scaled by the largest amax of steps `<= t - delay` (Keras:
    `delay` 2, the history being longer than the steps given), and its values
    above that amax saturate (see `float8_saturation_fraction`). Steps
    whose history holds fewer than `min_history` steps, or no positive amax,
    are not judged.

    Args:
        step_histograms: each step's exponent histogram.
        step_amax: each step's amax, or an upper bound of it (the running maximum).
        delay: steps between an amax and the first step scaled by it.
        clip_tolerance: count only values clipped by more than this relative amount.
        min_history: steps the history of a judged step holds at least.

    Returns:
        The clipped fraction of the judged steps' non-zero values, or `None`
        when no step could be judged.

    Example:

    >>> from autoprec.numerics.histogram import exponent_histogram
    >>> steps = [exponent_histogram([v, v / 2])[0] for v in (1.0, 1.0, 1.5)]
    >>> float8_delayed_saturation_fraction(steps, [1.0, 1.0, 1.5])  # 1.5 > 1.0 is clipped
    0.5
    """
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
