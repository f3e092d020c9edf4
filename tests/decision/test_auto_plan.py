"""Tests for `AutoPlan`: the automatic mode's settings and the errors they raise."""

from __future__ import annotations

import numpy as np
import pytest

import autoprec
from autoprec.decision import AutoPlan
from autoprec.errors import PlanError


def test_timing_rounds_must_be_a_count_or_zero():
    with pytest.raises(PlanError, match="timing_rounds must be an integer >= 1 or 0"):
        AutoPlan(timing_rounds=-1)
    assert "timing_rounds=3" in repr(AutoPlan(timing_rounds=3))


def test_counts_must_be_integers_of_at_least_one():
    for settings in ({"profile_steps": 0}, {"n_trials": True}, {"batch_size": 2.0}):
        with pytest.raises(PlanError, match="must be an integer >= 1"):
            AutoPlan(**settings)
    assert AutoPlan(batch_size=None).batch_size is None


def test_a_budget_needs_the_search_data_and_the_data_a_budget():
    budget = autoprec.Budget("val_accuracy", max_drop=0.01)
    data = (np.zeros((4, 3), "float32"), np.zeros((4,), "int32"))
    with pytest.raises(PlanError, match="needs x="):
        AutoPlan(budget=budget)
    with pytest.raises(PlanError, match="pass budget="):
        AutoPlan(x=data, validation_data=data)
    with pytest.raises(PlanError, match="must be an autoprec.Budget"):
        AutoPlan(budget="val_accuracy", x=data, validation_data=data)
    searching = AutoPlan(budget=budget, x=data, validation_data=data)
    assert "x=(ndarray(4, 3), ndarray(4,))" in repr(searching)


def test_the_decision_budget_is_a_share_of_the_whole_fit_and_the_race_pays_from_the_gain():
    from autoprec.decision import (
        DECISION_CAP_SECONDS,
        DECISION_SHARE,
        PAYBACK_SHARE,
        decision_budget,
        race_budget,
    )

    assert decision_budget(AutoPlan(), 100.0) == pytest.approx(DECISION_SHARE * 100.0)
    assert decision_budget(AutoPlan(), 1e6) == DECISION_CAP_SECONDS
    assert decision_budget(AutoPlan(), None) == DECISION_CAP_SECONDS
    assert decision_budget(AutoPlan(decision_seconds=7), 1e6) == 7.0
    # The race's traces are paid from the predicted gain over the steps left in the fit:
    # 0.3 s a step at 1.5x saves 0.1 s a step; 200 steps left.
    seconds, why = race_budget(AutoPlan(), 0.3, 1.5, 200, left_over=1.0)
    assert seconds == pytest.approx(PAYBACK_SHARE * 0.1 * 200)
    assert "1.50x" in why and "200 steps left" in why
    assert race_budget(AutoPlan(), 0.3, 0.9, 200, left_over=1.0)[0] == 0.0  # nothing to win
    # No prediction, or a budget given: what the decision budget leaves.
    assert race_budget(AutoPlan(), 0.3, None, 200, left_over=1.0)[0] == 1.0
    assert race_budget(AutoPlan(decision_seconds=5), 0.3, 1.5, 200, left_over=2.0)[0] == 2.0
    # A gain predicted from a CPU's rated peaks (a capability, not a speed): at least what the
    # decision budget leaves, so the race can measure it; the payback where that is more.
    payback = PAYBACK_SHARE * 0.3 * (1 - 1 / 1.03) * 200
    assert race_budget(AutoPlan(), 0.3, 1.03, 200, left_over=5.0)[0] == pytest.approx(payback)
    seconds, why = race_budget(AutoPlan(), 0.3, 1.03, 200, left_over=5.0, rated_only=True)
    assert seconds == 5.0 and "rated peaks" in why and "1.03x" in why
    assert race_budget(AutoPlan(), 0.3, 1.5, 200, 1.0, rated_only=True)[0] == pytest.approx(10.0)
    for wrong in (-1, "ten", True):
        with pytest.raises(PlanError, match="decision_seconds"):
            AutoPlan(decision_seconds=wrong)
    assert AutoPlan.from_config(AutoPlan(decision_seconds=3.5).get_config()).decision_seconds == 3.5
