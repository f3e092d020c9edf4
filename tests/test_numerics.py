"""Tests for autoprec.numerics: format facts, exponent histograms and derived risk figures."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from autoprec import numerics


def _histogram_of(exponent_counts: dict[int, int]) -> np.ndarray:
    histogram = np.zeros(numerics.HISTOGRAM_BINS, dtype=np.int64)
    for exponent, count in exponent_counts.items():
        histogram[exponent - numerics.HISTOGRAM_MIN_EXPONENT] = count
    return histogram


def test_format_facts_come_from_ml_dtypes():
    float16 = numerics.float_format("float16")
    assert float16.max == float(ml_dtypes.finfo("float16").max) == 65504.0
    assert float16.min_normal == 2.0**-14
    assert float16.min_subnormal == 2.0**-24
    assert float16.eps == 2.0**-10
    assert (float16.max_exponent, float16.min_normal_exponent) == (15, -14)
    assert float16.min_subnormal_exponent == -24
    bfloat16 = numerics.float_format("bfloat16")
    assert bfloat16.max == float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    assert (bfloat16.max_exponent, bfloat16.min_normal_exponent) == (127, -126)
    assert bfloat16.min_subnormal_exponent == -133
    assert bfloat16.eps == 2.0**-7


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
    histogram = _histogram_of({16: 1, 0: 4, -20: 2, -25: 1, -140: 2})
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


def test_headroom_and_exceeds_max():
    assert numerics.headroom_bits(65504.0) == 0.0
    assert numerics.headroom_bits(65504.0 / 4) == pytest.approx(2.0)
    assert numerics.headroom_bits(0.0) == math.inf
    assert numerics.exceeds_max(65505.0) and not numerics.exceeds_max(65504.0)
    assert not numerics.exceeds_max(1e30, "bfloat16")


def test_suggested_loss_scale_keeps_margin_below_max():
    assert numerics.suggested_loss_scale(1.0) == 2.0**14
    for max_abs in (1e-9, 3e-5, 0.7, 1.0, 40.0, 65504.0, 1e6):
        scale = numerics.suggested_loss_scale(max_abs)
        assert math.frexp(scale)[0] == 0.5  # a power of two
        if numerics.MIN_LOSS_SCALE < scale < numerics.MAX_LOSS_SCALE:
            assert max_abs * scale * 2 <= 65504.0 < max_abs * scale * 4
    assert numerics.suggested_loss_scale(0.0) == numerics.MAX_LOSS_SCALE
    assert numerics.suggested_loss_scale(1e-30) == numerics.MAX_LOSS_SCALE


def test_loss_scale_covers_range_both_ends():
    # Gradients from 2^-30 to 2^-10: a scale of 2^24 lifts them all above 2^-24.
    narrow = _histogram_of({-30: 10, -20: 100, -10: 10})
    assert numerics.loss_scale_covers_range(narrow, 120, max_abs=2.0**-10)
    assert numerics.required_loss_scale(narrow) == 2.0**6
    # Gradients from 2^-60 to 2^10: no scale keeps 2^10 in range and lifts 2^-60.
    wide = _histogram_of({-60: 50, 0: 50, 10: 1})
    assert not numerics.loss_scale_covers_range(wide, 101, max_abs=2.0**10)
    assert numerics.smallest_significant_exponent(wide) == -60
    # A few stragglers below the tolerance do not count as significant.
    stragglers = _histogram_of({-80: 1, -5: 10_000})
    assert numerics.smallest_significant_exponent(stragglers) == -5
    assert numerics.smallest_significant_exponent(np.zeros(numerics.HISTOGRAM_BINS)) is None
