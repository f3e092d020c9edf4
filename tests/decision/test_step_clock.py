"""Tests for `autoprec.decision.race`: the epoch's length and a trace's cost from fit's first steps."""

from __future__ import annotations

import time

import pytest

from autoprec.decision import StepClock


def test_a_trace_is_the_first_step_less_a_later_one_and_the_epoch_adds_the_other_steps():
    clock = StepClock(started=0.0, ends=[4.2, 4.3, 4.4, 4.6])
    assert clock.steps == 4
    assert clock.step_seconds() == pytest.approx(0.1)  # the median of 0.1, 0.1, 0.2
    assert clock.trace_seconds() == pytest.approx(4.1)
    assert clock.fit_estimate(30) == pytest.approx(4.2 + 29 * 0.1)


def test_one_step_bounds_the_trace_and_an_unknown_epoch_has_no_estimate():
    clock = StepClock(started=0.0, ends=[3.0])
    assert clock.step_seconds() is None
    assert clock.trace_seconds() == 3.0
    assert clock.fit_estimate(10) == 30.0
    assert clock.fit_estimate(None) is None
    assert StepClock().trace_seconds() is None and StepClock().fit_estimate(10) is None


def test_steps_are_timed_from_the_start():
    clock = StepClock()
    time.sleep(0.01)
    clock.step_ended()
    assert clock.steps == 1 and clock.ends[0] >= 0.01
