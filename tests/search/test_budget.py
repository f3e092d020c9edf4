"""Tests for `autoprec.search.budget`: mode, threshold, violation, validation."""

from __future__ import annotations

import dataclasses
import json

import pytest

from autoprec.errors import AutoprecError
from autoprec.search import Budget
from autoprec.search.budget import HIGHER_IS_BETTER, LOWER_IS_BETTER, infer_mode


@pytest.mark.parametrize(
    "metric, mode",
    [
        ("val_accuracy", "max"),
        ("val_sparse_categorical_accuracy", "max"),
        ("top_k_categorical_accuracy", "max"),
        ("val_auc", "max"),
        ("val_auc_1", "max"),  # Keras' suffix for a second AUC
        ("val_precision", "max"),
        ("recall", "max"),
        ("val_f1_score", "max"),
        ("val_mean_iou", "max"),
        ("r2_score", "max"),
        ("val_output_1_accuracy", "max"),
        ("val_loss", "min"),
        ("val_head_loss", "min"),
        ("val_mean_squared_error", "min"),
        ("val_mae", "min"),
        ("val_rmse", "min"),
        ("val_perplexity", "min"),
        ("val_sparse_categorical_crossentropy", "min"),
        ("squared_hinge", "min"),
        ("val_kl_divergence", "min"),
        ("log_cosh_error", "min"),
        ("val_poisson", "min"),
        ("false_positives", "min"),
        ("true_positives", "max"),
    ],
)
def test_budget_reads_mode_from_known_metric_names(metric, mode):
    budget = Budget(metric, max_drop=0.1)
    assert budget.mode == mode
    assert not hasattr(budget, "direction")  # the former name is gone in 0.3


@pytest.mark.parametrize("metric", ["val_score", "val_mean", "custom_metric", "accuracy_loss"])
def test_budget_refuses_a_name_it_cannot_read_and_asks_for_mode(metric):
    with pytest.raises(AutoprecError, match=f"{metric}.*mode='min'.*mode='max'"):
        Budget(metric, max_drop=0.1)
    assert Budget(metric, max_drop=0.1, mode="max").threshold(1.0) == pytest.approx(0.9)
    assert Budget(metric, max_drop=0.1, mode="min").threshold(1.0) == pytest.approx(1.1)


def test_the_tables_do_not_overlap_and_are_used():
    assert not LOWER_IS_BETTER & HIGHER_IS_BETTER
    assert {infer_mode(name) for name in LOWER_IS_BETTER} == {"min"}
    assert {infer_mode(f"val_{name}") for name in HIGHER_IS_BETTER} == {"max"}


def test_budget_threshold_and_violation():
    accuracy = Budget("val_accuracy", max_drop=0.01)
    assert accuracy.threshold(0.9) == pytest.approx(0.89)
    assert accuracy.violation(0.9, 0.895) < 0 < accuracy.violation(0.9, 0.88)
    loss = Budget("val_loss", max_drop=0.5, max_relative_drop=0.1)
    assert loss.threshold(2.0) == pytest.approx(2.2)
    assert loss.violation(2.0, float("nan")) > 1e20
    assert Budget("score", max_drop=1, mode="min").threshold(3) == 4
    assert Budget("val_loss", max_drop=1, mode="max").threshold(3) == 2  # mode overrides the name


def test_worse_by_is_the_worsening_in_the_metric_s_units_either_way():
    assert Budget("val_accuracy", max_drop=0.01).worse_by(0.9, 0.88) == pytest.approx(0.02)
    assert Budget("val_loss", max_drop=0.01).worse_by(1.0, 1.5) == pytest.approx(0.5)
    assert Budget("val_loss", max_drop=0.01).worse_by(1.0, 0.5) == pytest.approx(-0.5)
    loss = Budget("val_loss", max_relative_drop=0.1)
    assert loss.violation(2.0, 2.3) == pytest.approx(loss.worse_by(2.0, 2.3) - 0.2)


def test_budget_is_a_frozen_value_that_round_trips_through_json():
    budget = Budget("val_perplexity", max_relative_drop=0.02)
    assert json.loads(json.dumps(budget.to_dict())) == {
        "metric": "val_perplexity",
        "max_drop": None,
        "max_relative_drop": 0.02,
        "mode": "min",
    }
    assert Budget(**budget.to_dict()) == budget
    assert dataclasses.replace(budget, max_drop=0.5).mode == "min"
    with pytest.raises(dataclasses.FrozenInstanceError):
        budget.mode = "max"


def test_the_former_direction_argument_is_refused():
    with pytest.raises(TypeError, match="direction"):
        Budget("score", max_drop=1, direction="lower")


def test_budget_rejects_bad_arguments():
    with pytest.raises(AutoprecError, match="max_drop"):
        Budget("val_accuracy")
    with pytest.raises(AutoprecError, match="mode must be 'min'.*'max'.*got 'up'"):
        Budget("val_accuracy", max_drop=0.1, mode="up")
    with pytest.raises(AutoprecError, match="non-negative"):
        Budget("val_accuracy", max_drop=-1)
