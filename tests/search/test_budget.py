"""Tests for `autoprec.search.budget`: direction, threshold, violation, validation."""

from __future__ import annotations

import pytest

from autoprec.errors import AutoprecError
from autoprec.search import Budget


@pytest.mark.parametrize(
    "metric, direction",
    [
        ("val_accuracy", "higher"),
        ("val_loss", "lower"),
        ("val_mean_squared_error", "lower"),
        ("val_mae", "lower"),
        ("val_auc", "higher"),
        ("top_k_categorical_accuracy", "higher"),
    ],
)
def test_budget_infers_direction(metric, direction):
    assert Budget(metric, max_drop=0.1).direction == direction


def test_budget_threshold_and_violation():
    accuracy = Budget("val_accuracy", max_drop=0.01)
    assert accuracy.threshold(0.9) == pytest.approx(0.89)
    assert accuracy.violation(0.9, 0.895) < 0 < accuracy.violation(0.9, 0.88)
    loss = Budget("val_loss", max_drop=0.5, max_relative_drop=0.1)
    assert loss.threshold(2.0) == pytest.approx(2.2)
    assert loss.violation(2.0, float("nan")) > 1e20
    assert Budget("score", max_drop=1, direction="lower").threshold(3) == 4


def test_budget_rejects_bad_arguments():
    with pytest.raises(AutoprecError, match="max_drop"):
        Budget("val_accuracy")
    with pytest.raises(AutoprecError, match="direction"):
        Budget("val_accuracy", max_drop=0.1, direction="up")
    with pytest.raises(AutoprecError, match="non-negative"):
        Budget("val_accuracy", max_drop=-1)
