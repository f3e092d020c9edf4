"""Tests for `autoprec.search.driver`: `search()` end to end, its stages, its workers, float8 in the search."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys

import keras
import numpy as np
import optuna
import pytest
from conftest import build_mlp, classification_data
from pg_server import postgres_server  # noqa: F401  (the session fixture `postgres`)
from search.search_models import (
    attention_classifier,
    compiled_mlp,
    far_regression,
    far_targets,
    fast,
    labelled,
    mlp_data,
    prepared_search,
    wide_classifier,
)

import autoprec
from autoprec import PrecisionPlan, cost
from autoprec._core.timing import MAX_ROUNDS, MIN_ROUNDS, judge_rounds
from autoprec.errors import AutoprecError
from autoprec.hardware import resolve_hardware
from autoprec.search import (
    Budget,
    SearchSettings,
    TrialRecord,
    heuristic_plan,
    resolve_storage,
    search,
    search_in_processes,
)
from autoprec.search.driver import run_trials, search_metadata
from autoprec.search.evaluator import Evaluator, FidelityCheck
from autoprec.search.result import assignment_key, simplicity


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


def uniform_float16_loss(model: keras.Model, data) -> float:
    """The loss of the model's weights under Keras' global `mixed_float16` policy."""
    keras.config.set_dtype_policy("mixed_float16")
    try:
        copy = build_sensitive_model()
    finally:
        keras.config.set_dtype_policy("float32")
    copy.set_weights(model.get_weights())
    copy.compile(loss="mse")
    return copy.evaluate(*data, verbose=0)


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


def test_a_study_given_with_what_it_already_has_or_maximising_is_refused():
    model = compiled_mlp()
    train, val = mlp_data()
    budget = Budget("val_accuracy", max_drop=0.1)
    refused = {
        "not both": dict(study=optuna.create_study(), study_name="mlp"),
        "its own sampler": dict(study=optuna.create_study(), pruner=optuna.pruners.NopPruner()),
        "minimised": dict(study=optuna.create_study(direction="maximize")),
    }
    for message, arguments in refused.items():
        with pytest.raises(AutoprecError, match=message):
            search(model, train, val, budget=budget, n_trials=1, verbose=0, **arguments)


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
    assert len({plan.layers[path] for path in parameters}) > 1  # a mixed plan
    assert plan.metadata["measured_metric"] <= result.budget.threshold(result.reference_metric)
    warm = {TrialRecord.from_trial(t).warm_start: t for t in result.study.trials}
    uniform = warm["uniform bfloat16"]  # the head loses the resolution it needs near 1000
    assert uniform.state != optuna.trial.TrialState.COMPLETE or (
        TrialRecord.from_trial(uniform).budget_violation > 0
    )
    # Float16 overflows in `wide` and in `squeeze`, which reads it: the float16 start keeps both
    # out of float16, and Keras' uniform float16 policy gives a non-finite loss.
    start = TrialRecord.from_trial(warm["uniform float16"]).assignment
    assert start["wide"] != "float16" and start["squeeze"] != "float16"
    assert not np.isfinite(uniform_float16_loss(model, val))
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


def test_the_first_stages_return_typed_values_that_agree():
    with prepared_search(keep_float32=("dense_1",)) as prepared:
        context = prepared.context
        assert context.dtypes == ("float32", "bfloat16") and context.float16_trials is None
        assert context.hardware_profile.name == "rtx4090" and context.table.source.startswith(
            "predicted"
        )
        assert context.profile is None  # no float16: nothing to profile
        assert context.allowed["dense_1"] == ("float32",) and "dense_1" in context.removed
        assert context.outputs and all(path in context.compute for path in context.outputs)
        grouped = {path for group in context.groups for path in group.paths}
        assert grouped == set(context.compute)
        assert isinstance(context.fidelity, FidelityCheck) and context.spread is None
        reference = context.cache[assignment_key(context.uniform_assignment("float32"))]
        assert context.reference == reference.metrics["accuracy"]
        assert context.risk[sorted(context.outputs)[0]] >= 2.0  # output layers are riskiest
        assert context.float32_seconds == context.costs.step(context.normalise({}))[0]


def test_the_reference_spread_is_measured_when_asked_and_the_metadata_carries_it():
    budget = Budget("val_accuracy", max_drop=0.5)
    with prepared_search(budget=budget, reference_repeats=1) as prepared:
        spread = prepared.context.spread
        assert spread is not None and spread >= 0
        study = optuna.create_study(study_name="meta")
        prepared.context.study = study
        metadata = search_metadata(prepared.context)
        assert metadata["hardware"] == "rtx4090"
        assert metadata["budget"]["reference_spread"] == spread
        search = metadata["search"]
        assert search["study_name"] == "meta" and search["dtypes"] == ["float32", "bfloat16"]
        assert search["fidelity_check"] == dataclasses.asdict(prepared.context.fidelity)


def test_the_trial_stage_starts_with_the_warm_starts_and_records_the_reference(tmp_path):
    with prepared_search() as prepared:
        context = prepared.context
        context.storage, context.study_name, context.n_trials = str(tmp_path / "t.log"), "t", 2
        study = run_trials(context)
        assert study.study_name == "t" and len(study.trials) >= 2
        labels = [TrialRecord.from_trial(t).warm_start for t in study.trials[:2]]
        assert labels == ["float32", "uniform bfloat16"]
        assert study.user_attrs["reference_metric"] == prepared.context.reference
        assert prepared.context.metadata["search"]["study_name"] == "t"
        assert context.clock.seconds["trials"] > 0
        again = run_trials(prepared.context)
        finished = [t for t in again.trials if t.state.is_finished()]
        assert len(finished) == 4  # resumed: two more, no warm start enqueued twice


@pytest.mark.parametrize("kind", ["journal", pytest.param("postgres", marks=pytest.mark.slow)])
def test_two_processes_search_one_study_and_the_caller_gets_its_best_plan(tmp_path, request, kind):
    if kind == "postgres":
        storage = request.getfixturevalue("postgres").create_database("pool")
    else:
        storage = tmp_path / "workers.log"
    model = build_mlp()
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = classification_data(samples=192)
    result = search_in_processes(
        2,
        model,
        (x[:128], y[:128]),
        (x[128:], y[128:]),
        budget=Budget("val_accuracy", max_drop=0.05),
        storage=storage,
        study_name="pool",
        n_trials=3,
        hardware="rtx4090",
        verbose=0,
        settings=SearchSettings(dtypes=["float32", "bfloat16"], steps_per_trial=2),
    )
    study = optuna.load_study(study_name="pool", storage=resolve_storage(str(storage)))
    # 2 workers x 3 trials, and the finalists the caller's measured ranking added.
    count = len(study.trials)
    assert count >= 6 and len({t.number for t in study.trials}) == count
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    labels = [r.warm_start for r in map(TrialRecord.from_trial, study.trials) if r.warm_start]
    assert labels and len(labels) == len(set(labels))  # enqueued once across workers
    assert result.study.study_name == "pool" and len(result.study.trials) == count
    assert result.plan.metadata["search"]["trials"] == count


def wide_encoder(classes: int = 4):
    """Wide Dense layers around attention: float8 pays for them on `rtx4090` at a large batch."""
    import keras

    inputs = keras.Input((16, 64))
    hidden = keras.layers.Dense(512, name="embed")(inputs)
    attended = keras.layers.MultiHeadAttention(4, 128, name="attention")(hidden, hidden)
    hidden = keras.layers.LayerNormalization(name="norm")(keras.layers.Add()([hidden, attended]))
    hidden = keras.layers.Dense(2048, activation="gelu", name="up")(hidden)
    hidden = keras.layers.Dense(512, name="down")(hidden)
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    outputs = keras.layers.Dense(classes, activation="softmax", name="head")(pooled)
    model = keras.Model(inputs, outputs, name="wide_encoder")
    model.compile(
        keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


def test_a_search_on_fp8_hardware_puts_wide_dense_layers_in_float8_and_keeps_the_head_out():
    model = wide_encoder()
    train, val = labelled(model, samples=256)
    weights = [np.array(w) for w in model.get_weights()]
    result = search(
        model,
        train,
        val,
        budget=Budget("val_loss", max_relative_drop=0.5),
        n_trials=4,
        **fast(dtypes=("float32", "bfloat16", "float8"), cost_batch_size=512, baseline=None),
    )
    plan = result.plan
    classes = {path: info.class_name for path, info in plan.layer_info.items()}
    for path, dtype in plan.resolve().items():
        if dtype == "float8":
            assert classes[path] in ("Dense", "EinsumDense"), path
    assert plan.resolve()["head"] != "float8"
    evidence = plan.metadata["evidence"]
    assert "float8" in evidence["up"]["allowed"]
    assert "float8" not in evidence["head"]["allowed"]
    assert "output layer" in evidence["head"]["removed"]["float8"]
    assert "float8" not in evidence["norm"]["allowed"]
    assert evidence["up"]["seconds"]["float8"] < evidence["up"]["seconds"]["bfloat16"]
    warm = {TrialRecord.from_trial(t).warm_start for t in result.study.trials}
    assert "uniform float8" in warm
    # Keras' global float8 (every Dense/EinsumDense, the head too) is judged as a finalist.
    assert "keras float8_from_mixed_bfloat16" in warm
    float8_trials = [
        t
        for t in result.study.trials
        if t.state == optuna.trial.TrialState.COMPLETE
        and "float8" in TrialRecord.from_trial(t).assignment.values()
    ]
    assert float8_trials  # trials trained with Keras' float8 numerics (emulated here)
    # The user's model is unchanged: no float8 policy, no scaling variable left trainable.
    assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))
    assert all(layer.dtype_policy.quantization_mode is None for layer in model.layers)
    assert len(model.trainable_variables) == len(weights)
    reloaded = autoprec.PrecisionPlan.from_json(plan.to_json())
    assert reloaded == plan
