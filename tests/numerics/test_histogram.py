"""Tests for autoprec.numerics: exponent histograms and the fractions read from them."""

from __future__ import annotations

import numpy as np
import pytest
from numerics.histograms import histogram_of

from autoprec import numerics


def test_histogram_covers_every_finite_float32_exponent():
    assert numerics.HISTOGRAM_MIN_EXPONENT == -149
    assert numerics.HISTOGRAM_MAX_EXPONENT == 127
    assert numerics.HISTOGRAM_BINS == len(numerics.bin_exponents()) == 277
    extremes = np.array(
        [np.finfo(np.float32).smallest_subnormal, np.finfo(np.float32).max], dtype=np.float32
    )
    histogram, zeros, nonfinite = numerics.exponent_histogram(extremes)
    assert histogram[0] == 1 and histogram[-1] == 1
    assert (zeros, nonfinite) == (0, 0)


def test_exponent_histogram_handles_zeros_nonfinite_and_powers_of_two():
    values = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, np.nextafter(np.float32(1.0), 0), -2.0, 1e-40],
        dtype=np.float32,
    )
    histogram, zeros, nonfinite = numerics.exponent_histogram(values)
    counts = {int(e): int(c) for e, c in zip(numerics.bin_exponents(), histogram) if c}
    assert counts == {0: 1, -1: 1, 1: 1, -133: 1}
    assert (zeros, nonfinite) == (2, 3)


def test_fractions_for_float16_and_bfloat16():
    # 2^16 overflows float16, 2^-25 flushes to zero, 2^-20 is subnormal, 2^-140 flushes in bfloat16.
    histogram = histogram_of({16: 1, 0: 4, -20: 2, -25: 1, -140: 2})
    count = 12  # two zeros besides the ten histogram entries
    assert numerics.overflow_fraction(histogram, count, "float16") == 1 / 12
    assert numerics.underflow_fraction(histogram, count, "float16") == 3 / 12
    assert numerics.subnormal_fraction(histogram, count, "float16") == 2 / 12
    assert numerics.overflow_fraction(histogram, count, "bfloat16") == 0.0
    assert numerics.underflow_fraction(histogram, count, "bfloat16") == 2 / 12
    # A loss scale of 2^8 moves every value up eight bins.
    assert numerics.underflow_fraction(histogram, count, "float16", scale=2.0**8) == 2 / 12
    assert numerics.overflow_fraction(histogram, count, "float16", scale=2.0**8) == 1 / 12
    assert numerics.overflow_fraction(histogram, count, "float16", scale=2.0**-1) == 0.0
    with pytest.raises(ValueError, match="power of two"):
        numerics.overflow_fraction(histogram, count, "float16", scale=3.0)


def test_exceeds_max():
    assert numerics.exceeds_max(65505.0) and not numerics.exceeds_max(65504.0)
    assert not numerics.exceeds_max(1e30, "bfloat16")
