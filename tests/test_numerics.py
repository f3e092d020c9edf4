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


# ----------------------------------------------------------------------------- float8


def test_float8_formats_come_from_ml_dtypes_and_take_short_names():
    for name, alias in (("float8_e4m3fn", "e4m3"), ("float8_e5m2", "e5m2")):
        info = ml_dtypes.finfo(name)
        fmt = numerics.float_format(alias)
        assert fmt == numerics.float_format(name) == numerics.format_for(alias)
        assert fmt.name == name and fmt.max == float(info.max)
        assert fmt.min_normal == float(info.smallest_normal)
        assert fmt.min_subnormal == float(info.smallest_subnormal)
        assert fmt.mantissa_bits == info.nmant
    e4m3, e5m2 = numerics.FLOAT8_E4M3, numerics.FLOAT8_E5M2
    assert (e4m3.max, e4m3.min_subnormal_exponent, e4m3.mantissa_bits) == (448.0, -9, 3)
    assert (e5m2.max, e5m2.min_subnormal_exponent, e5m2.mantissa_bits) == (57344.0, -16, 2)
    assert numerics.float_format("float16").mantissa_bits == 10
    assert numerics.float8_scale(2.0, "e4m3") == 224.0
    assert numerics.float8_scale(0.0) == numerics.float8_scale(math.inf) == 1.0


def _true_flush_fraction(values: np.ndarray, amax: float, dtype) -> float:
    """What ml_dtypes does: scale per tensor as Keras does, cast, count the non-zeros now zero."""
    scaled = values * np.float32(numerics.format_for(dtype).max / amax)
    quantized = scaled.astype(dtype).astype(np.float32)
    nonzero = values != 0
    return np.count_nonzero(nonzero & (quantized == 0)) / np.count_nonzero(nonzero)


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
def test_float8_flush_fraction_matches_ml_dtypes(dtype):
    rng = np.random.default_rng(0)
    name = np.dtype(dtype).name
    # Exact when the threshold is a power of two: amax = max * 2^k.
    values = (2.0 ** rng.uniform(-40, 0, 20_000) * rng.choice([-1, 1], 20_000)).astype(np.float32)
    amax = numerics.format_for(name).max * 2.0**-3
    values[0] = amax
    histogram, _, _ = numerics.exponent_histogram(values)
    exact = numerics.float8_flush_fraction(histogram, amax, name)
    assert exact == pytest.approx(_true_flush_fraction(values, amax, dtype), abs=1e-12)
    assert 0.05 < exact < 0.95
    # Otherwise estimated inside one bin: Gaussian, Laplace and log-normal data.
    for values in (
        rng.normal(size=50_000),
        rng.laplace(size=50_000) * 1e-3,
        rng.lognormal(0, 4, 50_000) * rng.choice([-1, 1], 50_000),
    ):
        values = values.astype(np.float32)
        values[:5] *= 1e5  # a few outliers set the amax
        amax = float(np.abs(values).max())
        histogram, _, _ = numerics.exponent_histogram(values)
        minimum = float(np.abs(values[values != 0]).min())
        estimate = numerics.float8_flush_fraction(histogram, amax, name, min_abs=minimum)
        truth = _true_flush_fraction(values, amax, dtype)
        assert estimate == pytest.approx(truth, rel=0.05, abs=1e-4)
    assert numerics.float8_flush_fraction(np.zeros(numerics.HISTOGRAM_BINS), 1.0) == 0.0


def test_float8_saturation_fraction_matches_clipping():
    rng = np.random.default_rng(1)
    values = rng.normal(size=100_000).astype(np.float32)
    amax = float(np.abs(values).max())
    histogram, _, _ = numerics.exponent_histogram(values)
    # A scale from an amax of 2.0 (a power of two): exact, whatever the format.
    clipped = np.count_nonzero(np.abs(values) > 2.0) / values.size
    scaled = values * np.float32(448.0 / 2.0)
    assert clipped == np.count_nonzero(np.abs(scaled) > 448.0) / values.size
    assert numerics.float8_saturation_fraction(histogram, 2.0, amax=amax) == clipped
    # Otherwise estimated; a clip tolerance leaves the slightly clipped values out.
    history = amax / 1.7
    truth = np.count_nonzero(np.abs(values) > history * 1.125) / values.size
    estimate = numerics.float8_saturation_fraction(
        histogram, history, amax=amax, clip_tolerance=0.125
    )
    assert estimate == pytest.approx(truth, rel=0.3)
    assert numerics.float8_saturation_fraction(histogram, amax, amax=amax) == 0.0
    with pytest.raises(ValueError, match="positive"):
        numerics.float8_saturation_fraction(histogram, 0.0)


def test_amax_growth_and_delayed_saturation_follow_keras_delay():
    assert numerics.amax_growth([1.0, 2.0, 4.0, 8.0]) == 2.0
    assert numerics.amax_growth([4.0, 1.0, 2.0]) == 0.5  # never above the first step's
    assert numerics.amax_growth([3.0]) is None
    assert numerics.amax_growth([1.0, 5.0, 5.0, 6.0], min_history=2) == pytest.approx(1.2)
    # Each step holds the values 1 and 1/2 times a growing factor.
    factors = [1.0, 1.0, 1.0, 1.0, 8.0]
    histograms = [numerics.exponent_histogram([f, f / 2])[0] for f in factors]
    # Step 4 is scaled by the amax of step 2 (1.0): both 8 and 4 are clipped.
    assert numerics.float8_delayed_saturation_fraction(histograms, factors) == 2 / 6
    assert numerics.float8_delayed_saturation_fraction(histograms, factors, min_history=3) == 1.0
    # A delay of 5 leaves no step with a history.
    assert numerics.float8_delayed_saturation_fraction(histograms, factors, delay=5) is None
    steady = [numerics.exponent_histogram([1.0, 0.5])[0]] * 5
    assert numerics.float8_delayed_saturation_fraction(steady, [1.0] * 5) == 0.0
