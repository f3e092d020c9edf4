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


def test_the_decision_budget_is_a_share_of_the_fit_under_caps():
    from autoprec.decision import (
        DECISION_CAP_SECONDS,
        DECISION_SHARE,
        FIRST_EPOCH_SHARE,
        decision_budget,
    )

    assert decision_budget(AutoPlan(), 100.0) == DECISION_SHARE * 100.0
    assert decision_budget(AutoPlan(), 100.0, epochs=None) == DECISION_SHARE * 100.0
    # A longer fit can win more: a larger share of its first epoch, up to FIRST_EPOCH_SHARE.
    assert decision_budget(AutoPlan(), 100.0, epochs=2) == pytest.approx(2 * DECISION_SHARE * 100)
    assert decision_budget(AutoPlan(), 100.0, epochs=50) == pytest.approx(FIRST_EPOCH_SHARE * 100)
    assert decision_budget(AutoPlan(), 1e6, epochs=50) == DECISION_CAP_SECONDS
    assert decision_budget(AutoPlan(), 1e6) == DECISION_CAP_SECONDS
    assert decision_budget(AutoPlan(), None) == DECISION_CAP_SECONDS
    assert decision_budget(AutoPlan(decision_seconds=7), 1e6) == 7.0
    for wrong in (-1, "ten", True):
        with pytest.raises(PlanError, match="decision_seconds"):
            AutoPlan(decision_seconds=wrong)
    assert AutoPlan.from_config(AutoPlan(decision_seconds=3.5).get_config()).decision_seconds == 3.5
