"""Hand-made exponent histograms of the numerics tests."""

from __future__ import annotations

import numpy as np

from autoprec import numerics


def histogram_of(exponent_counts: dict[int, int]) -> np.ndarray:
    """An exponent histogram holding `count` values in the bin of each `exponent`."""
    histogram = np.zeros(numerics.HISTOGRAM_BINS, dtype=np.int64)
    for exponent, count in exponent_counts.items():
        histogram[exponent - numerics.HISTOGRAM_MIN_EXPONENT] = count
    return histogram
