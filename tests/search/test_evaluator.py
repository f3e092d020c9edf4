"""Tests for `autoprec.search.evaluator`: proxy, short training, the fidelity check and timing on a private copy."""

from __future__ import annotations

import logging
import math

import keras
import numpy as np
import pytest
from conftest import build_mlp, classification_data
from search.search_models import prepared_search

from autoprec._core.data import take_batches
from autoprec._core.timing import MIN_ROUNDS, judge_rounds, wants_more_rounds
from autoprec.errors import AutoprecError
from autoprec.plan import PrecisionPlan
from autoprec.search import (
    Budget,
    Evaluator,
    ProxyResult,
    SearchSettings,
    TrialRecord,
    clone_for_search,
    measure_step_rounds,
    measure_step_seconds,
    search,
)
from autoprec.search.evaluator import (
    ROUND_STEPS,
    check_reference,
    confirmation_reasons,
    longer_batches,
    measure_until_decided,
    trivial_baseline,
)
from autoprec.search.result import simplicity


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


def test_measuring_adds_rounds_only_while_undecided_and_stops_at_the_time_cap():
    with prepared_search(hardware="local") as prepared:
        context = prepared.context
        plans = {
            "float32": context.float32_plan(),
            "uniform bfloat16": context.plan_for(context.uniform_assignment("bfloat16")),
        }
        rounds = measure_until_decided(context.evaluator, plans, max_rounds=8)
        assert set(rounds) == set(plans)
        counts = sorted(len(figures) for figures in rounds.values())
        assert counts[0] >= MIN_ROUNDS and counts[-1] <= 8
        if counts[-1] > MIN_ROUNDS:  # more rounds were added: the first five were a tie
            first = {name: figures[:MIN_ROUNDS] for name, figures in rounds.items()}
            assert wants_more_rounds(judge_rounds(first, simplicity), max_rounds=8)
        capped = measure_until_decided(context.evaluator, plans, max_seconds=0.0)
        assert [len(figures) for figures in capped.values()] == [MIN_ROUNDS, MIN_ROUNDS]


def test_every_plan_is_timed_in_every_round_and_its_figure_is_its_fastest_round():
    with prepared_search(hardware="local") as prepared:
        context = prepared.context
        plans = [context.float32_plan(), context.plan_for(context.uniform_assignment("bfloat16"))]
        rounds = measure_step_rounds(context.evaluator, plans, rounds=3)
        assert [len(figures) for figures in rounds] == [3, 3]
        assert all(seconds > 0 for figures in rounds for seconds in figures)
        fastest = measure_step_seconds(context.evaluator, plans, rounds=2)
        assert len(fastest) == 2 and all(seconds > 0 for seconds in fastest)
        assert ROUND_STEPS >= 1


def binary_data(samples: int = 512):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 8)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int32")
    return (x[: samples * 3 // 4], y[: samples * 3 // 4]), (
        x[samples * 3 // 4 :],
        y[samples * 3 // 4 :],
    )


def binary_model(learning_rate: float = 3e-3) -> keras.Model:
    model = build_mlp(classes=2)
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def test_a_reference_that_cannot_learn_is_a_clear_error():
    model = build_mlp()
    model.compile(optimizer=keras.optimizers.SGD(1e-12), loss="sparse_categorical_crossentropy")
    train, val = binary_data()
    with pytest.raises(AutoprecError) as error:
        search(
            model,
            train,
            val,
            budget=Budget("val_loss", max_drop=0.05),
            hardware="rtx4090",
            n_trials=2,
            verbose=0,
            settings=SearchSettings(
                dtypes=["float32", "bfloat16"],
                steps_per_trial=2,
            ),
        )
    message = str(error.value)
    for words in (
        "val_loss",
        "after 16 train steps",
        "trivial baseline",
        "untrained",
        "steps_per_trial",
    ):
        assert words in message


def test_a_vacuous_budget_lengthens_training_until_the_baseline_misses_it(caplog):
    train, val = binary_data()
    with caplog.at_level(logging.INFO, logger="autoprec"):
        result = search(
            binary_model(),
            train,
            val,
            budget=Budget("val_accuracy", max_drop=0.1),
            hardware="rtx4090",
            n_trials=2,
            verbose=1,
            settings=SearchSettings(
                dtypes=["float32", "bfloat16"],
                steps_per_trial=1,
            ),
        )
    check = result.plan.metadata["search"]["fidelity_check"]
    assert check["requested_steps"] == 1 and check["train_steps"] > 1
    assert check["status"] == "meaningful" and check["baseline"] == 0.5
    assert result.reference_metric - 0.1 > 0.5  # chance misses the budget now
    assert result.plan.metadata["search"]["train_steps"] == check["train_steps"]
    assert "training longer" in caplog.text
    steps = {TrialRecord.from_trial(t).train_steps for t in result.study.trials}
    assert steps == {check["train_steps"]}


def test_trivial_baseline_is_chance_for_accuracy_and_untrained_otherwise():
    model = build_mlp()
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    train, val = binary_data(128)
    evaluator = Evaluator(
        model,
        take_batches(train, 32, 2, what="train"),
        take_batches(val, 32, None, what="val"),
    )
    assert trivial_baseline(evaluator, Budget("val_accuracy", max_drop=0.1)) == (
        pytest.approx(1 / 3),
        "chance (1/3 classes)",
    )
    value, kind = trivial_baseline(evaluator, Budget("val_loss", max_drop=0.1))
    assert kind == "untrained" and value == pytest.approx(evaluator.untrained_metrics()["loss"])
    evaluator.close()


def test_confirmation_reasons_low_fidelity_and_close_decisions():
    budget = Budget("val_accuracy", max_drop=0.1)
    assert confirmation_reasons(budget, 0.9, -0.09, 0.02, 200) == []
    assert confirmation_reasons(budget, 0.9, -0.01, 0.02, 200)[0].startswith("close decision")
    assert confirmation_reasons(budget, 0.9, -0.01, None, 200)[0].startswith("close decision")
    assert confirmation_reasons(budget, 0.9, -0.09, None, 20) == [
        "low fidelity (20 train steps < 64)"
    ]


def test_longer_batches_reads_arrays_again_and_repeats_an_iterator():
    x = np.arange(40, dtype="float32").reshape(20, 2)
    y = np.arange(20, dtype="float32")
    current = take_batches((x, y), 4, 2, what="train")
    longer = longer_batches((x, y), 4, 8, current)
    assert len(longer) == 8
    assert np.array_equal(longer[4][1], y[16:20]) and np.array_equal(longer[5][1], y[:4])
    iterator = iter([(x[:4], y[:4]), (x[4:8], y[4:8]), (x[8:12], y[8:12])])
    taken = take_batches(iterator, 4, 2, what="train")
    repeated = longer_batches(iterator, 4, 5, taken)
    assert [float(batch[1][0]) for batch in repeated] == [0.0, 4.0, 0.0, 4.0, 0.0]


def test_the_reference_s_validation_outputs_are_kept_at_its_final_fidelity():
    train, val = binary_data()
    model = binary_model()
    evaluator = Evaluator(
        model, take_batches(train, 32, 1, what="train"), take_batches(val, 32, None, what="val")
    )
    budget = Budget("val_accuracy", max_drop=0.1)
    metrics, check = check_reference(evaluator, budget, train, 32, 16, "auto")
    assert check.train_steps > check.requested_steps  # lengthened
    outputs = evaluator.float32_outputs()
    evaluator.train_and_evaluate(PrecisionPlan.uniform(model, "bfloat16"))
    assert evaluator.float32_outputs() is outputs  # kept, not trained again
    kept = evaluator.validation_metrics(outputs)
    assert kept["accuracy"] == pytest.approx(metrics["accuracy"])
    assert kept["loss"] == pytest.approx(metrics["loss"], rel=1e-5)
    evaluator.close()
