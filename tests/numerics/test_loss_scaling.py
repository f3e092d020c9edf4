"""Tests for autoprec.numerics: headroom and the loss scales that fit a gradient range."""

from __future__ import annotations

import math

import pytest
from numerics.histograms import histogram_of

from autoprec import numerics


def test_headroom_bits():
    assert numerics.headroom_bits(65504.0) == 0.0
    assert numerics.headroom_bits(65504.0 / 4) == pytest.approx(2.0)
    assert numerics.headroom_bits(0.0) == math.inf


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
    narrow = histogram_of({-30: 10, -20: 100, -10: 10})
    assert numerics.loss_scale_covers_range(narrow, 120, max_abs=2.0**-10)
    # Gradients from 2^-60 to 2^10: no scale keeps 2^10 in range and lifts 2^-60.
    wide = histogram_of({-60: 50, 0: 50, 10: 1})
    assert not numerics.loss_scale_covers_range(wide, 101, max_abs=2.0**10)
    # A few stragglers below the tolerance do not count.
    stragglers = histogram_of({-80: 1, -5: 10_000})
    assert numerics.loss_scale_covers_range(stragglers, 10_001, max_abs=2.0**-4)
    assert not numerics.loss_scale_covers_range(stragglers, 10_001, 2.0**-4, tolerance=1e-5)
