"""Tests for autoprec.numerics: flushed and clipped fractions under Keras' float8 scale."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from autoprec import numerics


def test_float8_scale_is_the_format_max_over_the_amax():
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
