"""Tests for `autoprec.search.budget`: mode, threshold, violation, and the output rounding floor."""

from __future__ import annotations

import dataclasses
import json
import math

import keras
import numpy as np
import pytest

from autoprec.errors import AutoprecError
from autoprec.layers import describe_model
from autoprec.search import Budget, has_classification_loss, rounding_floor_outputs
from autoprec.search.budget import (
    CONVERGENCE_HEADROOM,
    FLOAT32_OUTPUTS,
    FLOOR_FRACTION,
    HIGHER_IS_BETTER,
    LOWER_IS_BETTER,
    TARGETS,
    OutputFloor,
    converged_outputs,
    infer_mode,
    loss_names,
    measure_floor,
    round_to,
)
from autoprec.search.space import output_layers, output_paths


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


def test_budget_round_trips_through_json():
    budget = Budget("val_perplexity", max_relative_drop=0.02)
    assert json.loads(json.dumps(budget.to_dict())) == {
        "metric": "val_perplexity",
        "max_drop": None,
        "max_relative_drop": 0.02,
        "mode": "min",
    }
    assert Budget(**budget.to_dict()) == budget
    assert dataclasses.replace(budget, max_drop=0.5).mode == "min"


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


MSE = Budget("val_mse", max_relative_drop=0.02)
MAE = Budget("val_mae", max_relative_drop=0.02)


def _far_targets(samples: int = 4096) -> np.ndarray:
    """Targets near 1000 spread evenly over many bfloat16 steps (4 apart in [512, 1024))."""
    return np.random.default_rng(0).uniform(992.0, 1008.0, size=(samples, 1)).astype("float32")


def _regression(outputs: list[np.ndarray], y: np.ndarray) -> dict[str, float]:
    residual = outputs[0].astype("float64") - y
    return {"mse": float(np.mean(residual**2)), "mae": float(np.mean(np.abs(residual)))}


def test_round_to_keeps_8_significant_bits_in_bfloat16_and_11_in_float16():
    values = np.array([1001.0, 1003.0, 1000.3, 70000.0], "float32")
    assert round_to(values, "bfloat16")[:3].tolist() == [1000.0, 1004.0, 1000.0]
    assert round_to(values, "float16")[:3].tolist() == [1001.0, 1003.0, 1000.5]
    assert math.isinf(round_to(values, "float16")[3])  # beyond 65504
    assert round_to(values, "bfloat16")[3] == 70144.0  # bfloat16 has float32's range


def test_a_regression_near_1000_has_a_bfloat16_floor_near_1_3_mse_and_a_small_float16_one():
    y = _far_targets()
    metric_of = lambda outputs: _regression(outputs, y)  # noqa: E731
    bfloat16 = measure_floor(metric_of, [y], {0: "bfloat16"}, MSE)
    float16 = measure_floor(metric_of, [y], {0: "float16"}, MSE)
    assert bfloat16 == pytest.approx(16 / 12, rel=0.05)  # uniform errors within +-2
    assert float16 == pytest.approx(0.25 / 12, rel=0.05)  # steps of 0.5
    assert measure_floor(metric_of, [y], {0: "bfloat16"}, MAE) == pytest.approx(1.0, rel=0.05)
    # Added and subtracted errors give, for a symmetric metric, the rounded targets' own.
    assert bfloat16 == pytest.approx(_regression([round_to(y, "bfloat16")], y)["mse"], rel=1e-6)
    assert measure_floor(metric_of, [y], {}, MSE) == 0.0  # nothing rounded, no floor


def test_outputs_beyond_float16_range_have_an_infinite_floor():
    y = np.full((8, 1), 70000.0, "float32")
    floor = measure_floor(lambda outputs: _regression(outputs, y), [y], {0: "float16"}, MSE)
    assert math.isinf(floor)
    judged = OutputFloor(MSE, 1.0, {"head": "float16"}, {"head": floor}, {"head": TARGETS}, floor)
    assert judged.refused and "beyond the dtype's range" in judged.reason
    assert judged.to_dict()["value"] is None  # JSON has no inf


def test_a_classifier_with_ordinary_logits_has_no_decision_floor_and_a_negligible_loss_one():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 10, size=2048)
    logits = rng.normal(scale=2.0, size=(2048, 10)) + 3.0 * np.eye(10)[labels]
    probabilities = (np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)).astype("float32")

    def metric_of(outputs: list[np.ndarray]) -> dict[str, float]:
        p = np.clip(outputs[0].astype("float64"), 1e-7, 1.0)
        return {
            "accuracy": float(np.mean(np.argmax(outputs[0], axis=1) == labels)),
            "loss": float(np.mean(-np.log(p[np.arange(len(labels)), labels]))),
        }

    accuracy = Budget("val_accuracy", max_drop=0.005)
    loss = Budget("val_loss", max_relative_drop=0.02)
    for dtype in ("bfloat16", "float16"):
        assert measure_floor(metric_of, [probabilities], {0: dtype}, accuracy) == 0.0
        floor = measure_floor(metric_of, [probabilities], {0: dtype}, loss)
        reference = metric_of([probabilities])["loss"]
        judged = OutputFloor(loss, reference, {"head": dtype}, {"head": floor}, {}, floor)
        assert floor < 1e-4 * reference and not judged.refused


def test_the_rule_measures_the_allowance_against_a_converged_reference_and_refuses_a_far_head():
    def limit(budget: Budget, reference: float) -> float:
        return OutputFloor(budget, reference, {}, {}, {}, 0.0).limit

    assert (FLOOR_FRACTION, CONVERGENCE_HEADROOM) == (0.5, 10.0)
    # Lower is better: float32 may end up 10x closer to zero than seen.
    assert limit(Budget("val_loss", max_relative_drop=0.02), 20.0) == pytest.approx(0.02)
    # Higher is better and positive: float32 only gains allowance as it improves.
    assert limit(Budget("val_accuracy", max_drop=0.01), 0.6) == pytest.approx(0.005)
    assert limit(Budget("val_r2", max_relative_drop=0.1), 0.5) == pytest.approx(0.025)
    # Trials at this reference would hold the budget (allowance 2.0 > 1.33); converged, not.
    budget = Budget("val_loss", max_relative_drop=0.02)
    far = OutputFloor(budget, 100.0, {"head": "bfloat16"}, {"head": 1.33}, {"head": TARGETS}, 1.33)
    assert budget.allowance(100.0) > 1.33
    assert far.refused and far.limit == pytest.approx(0.1) and far.violation > 0
    assert far.break_even == pytest.approx(1.33 / 0.01)  # refused below |loss| 133
    assert "'head'" in far.reason and "no training removes" in far.reason
    assert "10x closer to zero" in far.reason
    near = OutputFloor(budget, 100.0, {"head": "float16"}, {"head": 0.02}, {"head": TARGETS}, 0.02)
    assert not near.refused and near.violation < 0
    mae = Budget("val_mae", max_drop=1.0)
    assert OutputFloor(mae, 1.0, {}, {}, {}, 0.6).break_even == math.inf
    assert OutputFloor(mae, 1.0, {}, {}, {}, 0.1).break_even is None
    record = far.to_dict()
    assert record["refused"] and record["rule"] == {"fraction": 0.5, "headroom": 10.0}
    assert record["floors"] == {"head": 1.33} and record["sources"] == {"head": TARGETS}


def test_converged_outputs_take_regression_targets_and_ask_float32_only_for_labels():
    y_value = np.arange(6, dtype="float32")
    labels = np.array([0, 1, 2, 0, 1, 2])
    calls = []

    def float32_outputs():
        calls.append(1)
        return [np.ones((6, 1), "float32"), np.full((6, 3), 1 / 3, "float32")]

    outputs, sources = converged_outputs([y_value], [(1,)], float32_outputs)
    assert sources == (TARGETS,) and not calls  # no prediction needed for a regression
    assert outputs[0].shape == (6, 1) and outputs[0][:, 0].tolist() == y_value.tolist()
    outputs, sources = converged_outputs([y_value, labels], [(1,), (3,)], float32_outputs)
    assert sources == (TARGETS, FLOAT32_OUTPUTS) and len(calls) == 1
    assert outputs[1].shape == (6, 3)


def test_output_paths_name_the_compute_layer_behind_each_output():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, name="hidden")(inputs)
    inner_inputs = keras.Input((8,))
    inner = keras.Model(
        inner_inputs,
        [
            keras.layers.Dense(2, name="a")(inner_inputs),
            keras.layers.Dense(3, name="b")(inner_inputs),
        ],
        name="inner",
    )
    first, second = inner(hidden)
    first = keras.layers.Activation("linear", name="linear")(first)  # pass-through: a's dtype
    third = keras.layers.Dense(1, name="c")(hidden)
    model = keras.Model(inputs, {"x": first, "y": second, "z": third})
    assert output_paths(model, describe_model(model)) == ("inner/a", "inner/b", "c")
    assert output_layers(model, describe_model(model)) == {"inner/a", "inner/b", "c"}
    sequential = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(2, name="d"), keras.layers.Activation("relu")]
    )
    assert output_paths(sequential, describe_model(sequential)) == ("d",)


def _model() -> keras.Model:
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(hidden))


def test_has_classification_loss_reads_strings_objects_and_functions():
    model = _model()
    for loss, expected in [
        ("sparse_categorical_crossentropy", True),
        (keras.losses.SparseCategoricalCrossentropy(from_logits=True), True),
        (keras.losses.binary_crossentropy, True),
        ("categorical_hinge", True),
        ("mse", False),
        (keras.losses.Huber(), False),
    ]:
        model.compile("adam", loss)
        assert has_classification_loss(model) is expected, loss
    model = _model()
    model.compile("adam", None)
    assert has_classification_loss(model) is False
    assert loss_names(model) == []


def test_a_regression_loss_floors_the_outputs_and_a_classification_loss_does_not():
    model = _model()
    assert rounding_floor_outputs(model, {"head"}) == {}  # not compiled: the loss is unknown
    model.compile("adam", "mse")
    reasons = rounding_floor_outputs(model, {"head"})
    assert list(reasons) == ["head"] and "'mse'" in reasons["head"] and "2^-9" in reasons["head"]
    model.compile("adam", "sparse_categorical_crossentropy")
    assert rounding_floor_outputs(model, {"head"}) == {}


def test_a_model_with_two_outputs_is_floored_unless_both_losses_classify():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8)(inputs)
    model = keras.Model(
        inputs,
        {
            "label": keras.layers.Dense(3, name="label")(hidden),
            "box": keras.layers.Dense(4, name="box")(hidden),
        },
    )
    model.compile("adam", {"label": "sparse_categorical_crossentropy", "box": "mae"})
    assert set(rounding_floor_outputs(model, {"label", "box"})) == {"label", "box"}
    assert sorted(loss_names(model)) == ["mae", "sparse_categorical_crossentropy"]
