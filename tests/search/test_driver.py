"""Tests for `autoprec.search.driver`: `search()` end to end, its failures and its measured confirmation."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import keras
import numpy as np
import optuna
import pytest
from search.search_models import (
    attention_classifier,
    compiled_mlp,
    far_regression,
    far_targets,
    fast,
    labelled,
    mlp_data,
    wide_classifier,
)

from autoprec import PrecisionPlan, cost
from autoprec._core.timing import MAX_ROUNDS, MIN_ROUNDS, judge_rounds
from autoprec.errors import AutoprecError
from autoprec.hardware import resolve_hardware
from autoprec.search import Budget, SearchSettings, TrialRecord, heuristic_plan, search
from autoprec.search.evaluator import Evaluator
from autoprec.search.record import simplicity


def measured_ranking(rounds):
    return list(judge_rounds(rounds, simplicity).order)


def build_sensitive_model() -> keras.Model:
    """Large activations (float16 overflows) and a head near 1000 needing fine resolution."""
    inputs = keras.Input((32,))
    hidden = keras.layers.Dense(
        1024,
        activation="relu",
        name="wide",
        kernel_initializer=keras.initializers.RandomNormal(stddev=1.0, seed=1),
    )(inputs)
    hidden = keras.layers.Dense(
        1024,
        activation="relu",
        name="squeeze",
        kernel_initializer=keras.initializers.RandomNormal(stddev=1.5e-5, seed=2),
    )(hidden)
    outputs = keras.layers.Dense(
        1, name="head", bias_initializer=keras.initializers.Constant(1000.0)
    )(hidden)
    return keras.Model(inputs, outputs, name="sensitive")


def sensitive_data(model: keras.Model):
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(512, 32)) * 4000).astype("float32")
    y = model.predict(x, verbose=0) + 0.1 * rng.normal(size=(512, 1)).astype("float32")
    return (x[:256], y[:256]), (x[256:], y[256:])


def test_unknown_metric_names_available_metrics():
    model = compiled_mlp()
    train, val = mlp_data()
    with pytest.raises(AutoprecError, match="val_accuracy") as error:
        search(
            model,
            train,
            val,
            budget=Budget("val_auc", max_drop=0.1),
            n_trials=1,
            **fast(),
        )
    assert "val_loss" in str(error.value)


def test_search_finds_mixed_plan_where_uniform_policies_fail():
    model = build_sensitive_model()
    train, val = sensitive_data(model)
    model.compile(optimizer=keras.optimizers.SGD(1e-12), loss="mse", metrics=["mae"])
    weights = [np.array(w) for w in model.get_weights()]
    result = search(
        model,
        train,
        val,
        budget=Budget("val_loss", max_drop=0.05),
        hardware="rtx4090",
        n_trials=12,
        verbose=0,
        settings=SearchSettings(
            dtypes=["float32", "bfloat16", "float16"],
            steps_per_trial=4,
            batch_size=64,
            cost_batch_size=4096,
            seed=0,
            baseline=None,  # the learning rate freezes the model on purpose: numerics only
        ),
    )
    plan = result.plan
    parameters = {path: plan.layer_info[path].parameters for path in ("wide", "squeeze", "head")}
    half = sum(n for path, n in parameters.items() if plan.layers[path] != "float32")
    assert half / sum(parameters.values()) > 0.9
    assert plan.layers["wide"] == "bfloat16"  # float16 overflows there
    assert plan.metadata["measured_metric"] <= result.budget.threshold(result.reference_metric)
    warm = {TrialRecord.from_trial(t).warm_start: t for t in result.study.trials}
    for label in ("uniform bfloat16", "uniform float16"):
        assert warm[label].state != optuna.trial.TrialState.COMPLETE or (
            TrialRecord.from_trial(warm[label]).budget_violation > 0
        )
    assert all(TrialRecord.from_trial(t).fidelity for t in result.study.trials)
    # Float16 trials are emulated where this device has no fast float16 kernels.
    fast_here = resolve_hardware("local").is_fast("float16")
    expected = "native" if fast_here else "emulated"
    assert plan.metadata["search"]["float16_trials"] == expected
    # The user's model is unchanged.
    assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))
    assert all(layer.dtype_policy.name == "float32" for layer in model.layers)
    assert int(model.optimizer.iterations.numpy()) == 0
    assert "chosen" in result.report()
    assert result.pareto and result.pareto[0].predicted_seconds <= result.float32_predicted_seconds


def test_failing_trial_is_marked_failed_and_search_goes_on(monkeypatch):
    original = Evaluator.train_and_evaluate

    calls = []

    def flaky(self, plan, *args, **kwargs):
        calls.append(plan)
        if len(calls) == 2:  # the first is the float32 reference; crash the first trial's run
            raise RuntimeError("simulated crash")
        return original(self, plan, *args, **kwargs)

    monkeypatch.setattr(Evaluator, "train_and_evaluate", flaky)
    train, val = mlp_data()
    result = search(
        compiled_mlp(),
        train,
        val,
        budget=Budget("val_accuracy", max_drop=0.5),
        n_trials=6,
        **fast(baseline=None),
    )
    states = [t.state for t in result.study.trials]
    assert optuna.trial.TrialState.FAIL in states
    finalists = result.plan.metadata["search"]["finalists"]
    # The crashed trial was uniform bfloat16: Keras' mixed_bfloat16 (the same plan) is
    # trained after the 6 trials, as a finalist of its own.
    added = set(finalists["trials"]) - set(finalists["same_as"])
    assert added == {"keras mixed_bfloat16"} and len(states) == 6 + len(added)


@pytest.mark.slow
def test_same_seed_same_trials():
    train, val = mlp_data()
    runs = []
    for _ in range(2):
        keras.utils.set_random_seed(0)
        result = search(
            compiled_mlp(),
            train,
            val,
            budget=Budget("val_accuracy", max_drop=0.1),
            n_trials=5,
            **fast(),
        )
        runs.append([(t.params, TrialRecord.from_trial(t).metric) for t in result.study.trials])
    assert runs[0] == runs[1]


def test_measured_step_confirms_the_final_plan_against_uniform_plans():
    train, val = mlp_data()
    settings = fast(hardware="local", measure_speedup=True)
    result = search(
        compiled_mlp(),
        train,
        val,
        budget=Budget("val_accuracy", max_drop=0.5),
        n_trials=4,
        **settings,
    )
    measured = result.plan.metadata["search"]["measured_step_seconds"]
    assert "float32" in measured and len(measured) >= 2
    record = result.plan.metadata["search"]
    chosen = record["measured_plan_step_seconds"]
    rounds = record["measured_step_rounds"]
    assert set(rounds) == set(measured)
    assert all(MIN_ROUNDS <= len(r) <= MAX_ROUNDS for r in rounds.values())
    # The plan returned is the first of the measured ranking (confirmation not needed here).
    first = measured_ranking(rounds)[0]
    assert chosen == measured[first]
    measurement = record["measurement"]
    assert measurement["leader"] == first and measurement["verdict"] in ("separated", "tie")
    assert "keras mixed_bfloat16" in record["finalists"]["trials"]  # the MLP's: a trial's plan
    assert "measured: " in result.report()
    replaced = record.get("replaced_by_measurement")
    # Recorded when another trial's plan replaced the searched one (not when it is the same).
    assert replaced is None if first == "searched" else replaced in (first, None)
    assert result.plan.metadata["measured_speedup"] == pytest.approx(measured["float32"] / chosen)


def _assignment_seconds(trial) -> float:
    return TrialRecord.from_trial(trial).predicted_seconds


@pytest.mark.parametrize("build", [wide_classifier, attention_classifier])
def test_the_plan_costs_no_more_than_any_uniform_or_heuristic_plan_within_budget(build):
    keras.utils.set_random_seed(0)
    model = build()
    train, val = labelled(model, 512)
    result = search(
        model,
        train,
        val,
        budget=Budget("val_accuracy", max_drop=0.1),
        hardware="rtx4090",
        n_trials=4,
        verbose=0,
        settings=SearchSettings(
            dtypes=["float32", "bfloat16"],
            steps_per_trial=4,
            cost_batch_size=4096,
            group_by=2,  # coarse groups: the heuristic's per-layer plan is not one of them
            proxy_batches=1,
        ),
    )
    trials = result.study.trials
    records = [TrialRecord.from_trial(t) for t in trials]
    finalists = result.plan.metadata["search"]["finalists"]
    keras_number = finalists["trials"]["keras mixed_bfloat16"]
    keras_trial = records[keras_number]
    # Containers get their sub-layers' dtype, so Keras' policy is the search's uniform plan:
    # that trial stands for it.
    assert finalists["same_as"] == {"keras mixed_bfloat16": keras_trial.warm_start}
    assert "float32" not in set(result.study.trials[keras_number].params.values())
    finalist_labels = set(finalists["trials"]) - set(finalists["same_as"])
    warm = [
        t for t, r in zip(trials, records) if r.warm_start and r.warm_start not in finalist_labels
    ]
    labels = [records[t.number].warm_start for t in warm]
    assert labels[0] == "float32" and "uniform bfloat16" in labels
    assert [t.number for t in warm] == list(range(len(warm)))  # evaluated first
    heuristic = heuristic_plan(model, hardware="rtx4090", dtypes=["float32", "bfloat16"])
    for trial in warm:  # ungrouped: each carries its whole per-layer assignment
        assert trial.state == optuna.trial.TrialState.COMPLETE
        assert set(records[trial.number].assignment) == set(result.plan.metadata["evidence"])
    if "heuristic" in labels:
        stored = records[warm[labels.index("heuristic")].number].assignment
        assert stored["norm"] == "float32"  # kept by the heuristic, though its group is 16-bit
        assert any(dtype == "bfloat16" for dtype in stored.values())
    # Uniform first: a classifier's head runs in Keras' policy, the loss reads it in float32.
    assert heuristic.layers["head"] == "bfloat16"
    chosen = result.plan.metadata["search"]["best_trial"]
    chosen_seconds = _assignment_seconds(trials[chosen])
    for trial in warm:
        if records[trial.number].budget_violation <= 0:
            assert chosen_seconds <= _assignment_seconds(trial) * (1 + 1e-9)
    uniform = warm[labels.index("uniform bfloat16")]
    assert records[uniform.number].predicted_seconds < result.float32_predicted_seconds
    assert dict(result.plan.layers).items() >= records[chosen].assignment.items()
    report = result.report()
    assert "uniform bfloat16" in report and "float32:" in report
    assert result.plan.metadata["search"]["warm_starts"]["float32"]["within_budget"]


def test_failing_confirmation_falls_back_to_the_next_plan():
    keras.utils.set_random_seed(0)
    train, val = far_targets()
    result = search(
        far_regression(),
        train,
        val,
        budget=Budget("val_mae", max_relative_drop=0.35),  # loose enough for 2 steps, not for 8
        hardware="rtx4090",
        n_trials=3,
        verbose=0,
        settings=SearchSettings(
            dtypes=["float32", "bfloat16"],
            steps_per_trial=2,
            cost_batch_size=4096,
            proxy_batches=1,
        ),
    )
    confirmation = result.plan.metadata["search"]["confirmation"]
    assert confirmation["run"] and confirmation["train_steps"] == 8
    assert any("low fidelity" in reason for reason in confirmation["reasons"])
    attempts = confirmation["attempts"]
    records = [TrialRecord.from_trial(trial) for trial in result.study.trials]
    uniform = next(record for record in records if record.warm_start == "uniform bfloat16")
    if "floor" in uniform.fidelity:  # its bfloat16 head's rounding floor refused it untrained
        assert all(attempt["label"] != "uniform bfloat16" for attempt in attempts)
    else:  # trained 2 steps it held the budget; trained 8 it does not
        first, second = attempts[:2]
        assert first["label"] == "uniform bfloat16" and not first["held"]  # the head cannot resolve
        assert second["held"] and confirmation["result"] == "fell back"
    assert attempts[-1]["held"]
    assert result.plan.layers["head"] == "float32"
    assert result.plan.layers["wide1"] == result.plan.layers["wide2"] == "bfloat16"
    assert result.plan.metadata["search"]["best_trial"] == attempts[-1]["trial"]


def test_tiny_model_stays_float32_and_named_hardware_costs_are_called_predicted(caplog):
    train, val = mlp_data()
    with caplog.at_level(logging.INFO, logger="autoprec"):
        result = search(
            compiled_mlp(),
            train,
            val,
            budget=Budget("val_accuracy", max_drop=0.05),
            hardware="rtx4090",
            n_trials=2,
            verbose=1,
            settings=SearchSettings(
                steps_per_trial=2,
            ),
        )
    assert set(result.plan.layers.values()) == {"float32"}  # launch-bound layers: right answer
    text = caplog.text
    assert "predicted for rtx4090" in text
    assert "on this device" not in text


_SEARCH_ON_ANOTHER_BACKEND = """
import keras, numpy as np
import autoprec
from autoprec.errors import BackendError
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
model.compile("adam", "mse")
data = (np.zeros((8, 4), "float32"), np.zeros((8, 2), "float32"))
try:
    autoprec.search(model, data, data, budget=autoprec.Budget("val_loss", max_relative_drop=0.1))
except BackendError as error:
    print("REFUSED", error)
"""


def test_search_on_a_backend_without_the_guard_is_refused_naming_the_supported_ones():
    environment = {**os.environ, "KERAS_BACKEND": "numpy", "TF_CPP_MIN_LOG_LEVEL": "3"}
    completed = subprocess.run(
        [sys.executable, "-c", _SEARCH_ON_ANOTHER_BACKEND],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "REFUSED autoprec.search runs on Keras' TensorFlow and JAX backends" in completed.stdout
    assert "this Keras runs 'numpy'" in completed.stdout


def test_the_search_returns_a_plan_predicted_no_slower_than_any_uniform_policy():
    inputs = keras.Input((256,))
    hidden = keras.layers.Dense(1024, activation="relu", name="wide")(inputs)
    hidden = keras.layers.LayerNormalization(name="norm")(hidden)
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile("adam", "sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 256)).astype("float32")
    y = rng.integers(0, 10, 256)
    result = search(
        model,
        (x[:192], y[:192]),
        (x[192:], y[192:]),
        budget=Budget("val_loss", max_relative_drop=1.0),  # every uniform policy is within it
        hardware="rtx4090",
        n_trials=4,
        verbose=0,
        settings=SearchSettings(
            dtypes=["float32", "bfloat16"],
            steps_per_trial=2,
            batch_size=64,
            cost_batch_size=4096,
            baseline=None,  # random labels: numerics and costs only
        ),
    )
    table = cost.predict_costs(model, "rtx4090", batch_size=4096)

    def step(plan) -> float:
        return cost.estimate(model, plan, costs=table, batch_size=4096).step_seconds

    chosen = step(result.plan)
    for dtype in ("float32", "bfloat16"):
        assert chosen <= step(PrecisionPlan.uniform(model, dtype)) * 1.0001, dtype
