"""Tests for `autoprec.search.evaluator`: proxy, short training and timing on a private copy."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
from conftest import build_mlp, classification_data

from autoprec._core.data import take_batches
from autoprec.plan import PrecisionPlan
from autoprec.search import Evaluator, ProxyResult, clone_for_search, measure_step_seconds


def _evaluator() -> tuple[Evaluator, object]:
    model = build_mlp()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = classification_data(samples=96)
    train = take_batches((x[:64], y[:64]), batch_size=32, steps=2, what="train")
    val = take_batches((x[64:], y[64:]), batch_size=32, steps=None, what="val")
    return Evaluator(model, train, val, proxy_batches=1, seed=0), model


def test_proxy_of_float32_is_exact_and_of_bfloat16_is_close():
    evaluator, model = _evaluator()
    exact = evaluator.proxy(PrecisionPlan.uniform(model, "float32"))
    assert exact.finite and exact.score == 0.0 and exact.gradient_cosine > 0.999999
    close = evaluator.proxy(PrecisionPlan.uniform(model, "bfloat16"))
    assert close.finite and 0.0 < close.score < 0.5


def test_training_and_timing_leave_the_user_model_unchanged():
    evaluator, model = _evaluator()
    weights = [np.array(w) for w in model.get_weights()]
    assert evaluator.is_clone and evaluator.model is not model
    assert evaluator.batch_size == 32
    assert {"loss", "accuracy"} <= set(evaluator.metric_names())
    plan = PrecisionPlan.uniform(model, "bfloat16")
    first = evaluator.train_and_evaluate(plan)
    assert first == evaluator.train_and_evaluate(plan)  # same weights, batches and seed
    assert evaluator.step_seconds(plan, steps=2, warmup=1) > 0
    seconds = measure_step_seconds(
        evaluator, [PrecisionPlan.uniform(model, "float32"), plan], rounds=1
    )
    assert len(seconds) == 2 and all(value > 0 for value in seconds)
    evaluator.close()
    assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))
    assert int(model.optimizer.iterations.numpy()) == 0


def test_clone_for_search_copies_weights():
    model = build_mlp()
    clone, is_clone = clone_for_search(model)
    assert is_clone and clone is not model
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), clone.get_weights()))


def test_proxy_result_score_and_json():
    broken = ProxyResult(math.inf, -1.0, math.inf, False)
    assert broken.score == math.inf
    assert broken.to_dict() == {
        "loss_relative_error": None,
        "gradient_cosine": -1.0,
        "gradient_relative_error": None,
        "finite": False,
    }
    assert ProxyResult(0.1, 0.9, 0.2, True).score == 0.2


def test_emulated_float16_trains_like_native_float16_with_every_update_applied():
    """Emulated float16 (float32 math, float16 rounding) lands where native float16 does."""
    results = {}
    for emulate in (False, True):
        evaluator, model = _evaluator()
        assert evaluator.emulate_float16() if emulate else not evaluator.emulates_float16
        metrics = evaluator.train_and_evaluate(PrecisionPlan.uniform(model, "float16"))
        optimizer = evaluator.model.optimizer
        # Steps the loss scale skipped while coming down from 2**15 are trained again.
        assert int(optimizer.iterations.numpy()) == len(evaluator.train_batches)
        results[emulate] = metrics
        evaluator.close()
        assert "call" not in vars(model.layers[-1])
    float32_evaluator, model = _evaluator()
    reference = float32_evaluator.train_and_evaluate(PrecisionPlan.uniform(model, "float32"))
    for name in ("loss", "accuracy"):
        assert math.isclose(results[True][name], results[False][name], rel_tol=0.02, abs_tol=0.02)
    assert math.isclose(results[True]["loss"], reference["loss"], rel_tol=0.05)


def test_step_rounds_time_every_plan_on_its_own_copy_in_rotating_rounds():
    evaluator, model = _evaluator()
    plans = [PrecisionPlan.uniform(model, "float32"), PrecisionPlan.uniform(model, "bfloat16")]
    figures = evaluator.step_rounds(plans, rounds=3, steps=2)
    assert [len(rounds) for rounds in figures] == [3, 3]
    assert all(value > 0 for rounds in figures for value in rounds)
    # The working model is untouched: still at its initial weights, no plan applied.
    assert all(
        np.array_equal(np.asarray(variable), value)
        for variable, value in evaluator.initial_state["variables"].values()
    )


def test_validation_metrics_of_given_outputs_are_what_evaluate_reports():
    evaluator, model = _evaluator()
    plan = PrecisionPlan.uniform(model, "float32")
    logs = evaluator.train_and_evaluate(plan, keep_outputs=True)
    outputs = evaluator.float32_outputs()
    assert outputs.shape == (32, 3)
    computed = evaluator.validation_metrics(outputs)
    assert set(computed) == set(logs)
    for name, value in logs.items():
        assert computed[name] == pytest.approx(value, rel=1e-5)
    assert evaluator.float32_outputs() is outputs  # kept, not trained again
    evaluator.set_train_batches(evaluator.train_batches)  # another fidelity: trained again
    again = evaluator.float32_outputs()
    assert again is not outputs and np.allclose(again, outputs, atol=1e-6)
    wrong = np.roll(outputs, 1, axis=1)
    assert evaluator.validation_metrics(wrong)["loss"] > computed["loss"]


def test_validation_metrics_name_each_output_as_evaluate_does():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    value = keras.layers.Dense(1, name="value")(hidden)
    kind = keras.layers.Dense(3, activation="softmax", name="kind")(hidden)
    model = keras.Model(inputs, {"value": value, "kind": kind})
    model.compile(
        optimizer="adam",
        loss={"value": "mse", "kind": "sparse_categorical_crossentropy"},
        metrics={"value": ["mae"], "kind": ["accuracy"]},
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = {"value": rng.normal(size=(64, 1)).astype("float32"), "kind": rng.integers(0, 3, 64)}
    batches = take_batches((x, y), batch_size=32, steps=2, what="train")
    evaluator = Evaluator(model, batches, batches, proxy_batches=1, seed=0)
    logs = evaluator.train_and_evaluate(PrecisionPlan.uniform(model, "float32"), keep_outputs=True)
    computed = evaluator.validation_metrics(evaluator.float32_outputs())
    assert {"loss", "value_loss", "value_mae", "kind_loss", "kind_accuracy"} <= set(logs)
    for name, figure in logs.items():
        assert computed[name] == pytest.approx(figure, rel=1e-4)
