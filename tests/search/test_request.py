"""Tests for the stage clock of a search."""

from __future__ import annotations

import time

import pytest

from autoprec.search.settings import StageClock


def test_the_clock_adds_up_each_stage_even_when_it_raises():
    clock = StageClock()
    for _ in range(2):
        with clock.stage("trials"):
            time.sleep(0.01)
    with pytest.raises(KeyboardInterrupt), clock.stage("confirmation"):
        raise KeyboardInterrupt
    assert clock.seconds["trials"] >= 0.02 and set(clock.seconds) == {"trials", "confirmation"}
