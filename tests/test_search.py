"""Tests for `autoprec.search`: budget, fidelity levels, warm starts, storage, resume, workers."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import keras
import numpy as np
import optuna
import pytest
from conftest import build_mlp, classification_data

import autoprec
from autoprec._search_space import group_layers
from autoprec.errors import AutoprecError
from autoprec.search import Budget, _storage, heuristic_plan, search

FAST = dict(
    hardware="rtx4090",
    dtypes=["float32", "bfloat16"],
    train_steps=2,
    batch_size=32,
    proxy_batches=1,
    verbose=0,
    seed=0,
)


def compiled_mlp() -> keras.Model:
    model = build_mlp()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def mlp_data():
    x, y = classification_data(samples=192)
    return (x[:128], y[:128]), (x[128:], y[128:])


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


# ---------------------------------------------------------------------------- Budget


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


def test_unknown_metric_names_available_metrics():
    model = compiled_mlp()
    train, val = mlp_data()
    with pytest.raises(AutoprecError, match="val_accuracy") as error:
        search(model, train, val, Budget("val_auc", max_drop=0.1), n_trials=1, **FAST)
    assert "val_loss" in str(error.value)


# ---------------------------------------------------------------------------- space, heuristic


def test_group_layers_by_block_and_count():
    paths = ["conv1", "conv2_block1_1", "conv2_block1_2", "block_3_a", "block_3_b", "head"]
    groups = group_layers(paths, "block", separate={"head"})
    assert groups == [
        ["conv1"],
        ["conv2_block1_1", "conv2_block1_2"],
        ["block_3_a", "block_3_b"],
        ["head"],
    ]
    assert sum(len(group) for group in group_layers(paths, 3, separate={"head"})) == 6
    assert len(group_layers(paths, "layer")) == 6


def test_heuristic_keeps_softmax_head_and_bisects(mlp):
    plan = heuristic_plan(mlp, hardware="rtx4090")
    assert plan.layers["dense_2"] == "float32"  # output (softmax) layer
    assert plan.layers["dense"] != "float32"
    checked = heuristic_plan(
        mlp, hardware="rtx4090", check=lambda p: p.layers["dense"] == "float32"
    )
    assert checked.layers["dense"] == "float32"
    assert checked.layers["dense_1"] != "float32"


# ---------------------------------------------------------------------------- acceptance


def test_search_finds_mixed_plan_where_uniform_policies_fail():
    model = build_sensitive_model()
    train, val = sensitive_data(model)
    model.compile(optimizer=keras.optimizers.SGD(1e-12), loss="mse", metrics=["mae"])
    weights = [np.array(w) for w in model.get_weights()]
    result = search(
        model,
        train,
        val,
        Budget("val_loss", max_drop=0.05),
        hardware="rtx4090",
        dtypes=["float32", "bfloat16", "float16"],
        n_trials=12,
        train_steps=4,
        batch_size=64,
        cost_batch_size=4096,
        seed=0,
        verbose=0,
    )
    plan = result.plan
    parameters = {path: plan.layer_info[path].parameters for path in ("wide", "squeeze", "head")}
    half = sum(n for path, n in parameters.items() if plan.layers[path] != "float32")
    assert half / sum(parameters.values()) > 0.9
    assert plan.layers["wide"] == "bfloat16"  # float16 overflows there
    assert plan.metadata["measured_metric"] <= result.budget.threshold(result.reference_metric)
    warm = {t.user_attrs.get("warm_start"): t for t in result.study.trials}
    for label in ("uniform bfloat16", "uniform float16"):
        assert warm[label].state != optuna.trial.TrialState.COMPLETE or (
            warm[label].user_attrs["budget_violation"] > 0
        )
    assert all("fidelity" in t.user_attrs for t in result.study.trials)
    # The user's model is unchanged.
    assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))
    assert all(layer.dtype_policy.name == "float32" for layer in model.layers)
    assert int(model.optimizer.iterations.numpy()) == 0
    assert "chosen" in result.report()
    assert result.pareto and result.pareto[0].predicted_seconds <= result.float32_predicted_seconds


# ---------------------------------------------------------------------------- storage


def test_resume_accumulates_without_duplicate_warm_starts(tmp_path):
    storage = str(tmp_path / "study.log")
    train, val = mlp_data()
    budget = Budget("val_accuracy", max_drop=0.2)
    for _ in range(2):
        keras.utils.set_random_seed(0)
        search(
            compiled_mlp(), train, val, budget, n_trials=3, storage=storage, study_name="s", **FAST
        )
    study = optuna.load_study(study_name="s", storage=_storage(storage))
    assert len(study.trials) == 6
    labels = [
        t.user_attrs.get("warm_start") for t in study.trials if t.user_attrs.get("warm_start")
    ]
    assert len(labels) == len(set(labels))


def test_keyboard_interrupt_keeps_finished_trials_and_plan(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    plan_path = tmp_path / "best.json"
    train, val = mlp_data()

    def interrupt(study, trial):
        if trial.number >= 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        search(
            compiled_mlp(),
            train,
            val,
            Budget("val_accuracy", max_drop=0.2),
            n_trials=10,
            storage=storage,
            study_name="interrupted",
            plan_path=plan_path,
            callbacks=[interrupt],
            **FAST,
        )
    study = optuna.load_study(study_name="interrupted", storage=storage)
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) == 2
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE
    assert autoprec.PrecisionPlan.load(plan_path).metadata["budget"]["metric"] == "val_accuracy"


def test_failing_trial_is_marked_failed_and_search_goes_on(monkeypatch):
    from autoprec import _search_eval

    original = _search_eval.Evaluator.train_and_evaluate

    calls = []

    def flaky(self, plan, batch_order=None):
        calls.append(plan)
        if len(calls) == 2:  # the first is the float32 reference; crash the first trial's run
            raise RuntimeError("simulated crash")
        return original(self, plan, batch_order)

    monkeypatch.setattr(_search_eval.Evaluator, "train_and_evaluate", flaky)
    train, val = mlp_data()
    result = search(
        compiled_mlp(), train, val, Budget("val_accuracy", max_drop=0.5), n_trials=6, **FAST
    )
    states = [t.state for t in result.study.trials]
    assert optuna.trial.TrialState.FAIL in states
    assert len(states) == 6


@pytest.mark.slow
def test_same_seed_same_trials():
    train, val = mlp_data()
    runs = []
    for _ in range(2):
        keras.utils.set_random_seed(0)
        result = search(
            compiled_mlp(), train, val, Budget("val_accuracy", max_drop=0.1), n_trials=5, **FAST
        )
        runs.append([(t.params, t.user_attrs.get("metric")) for t in result.study.trials])
    assert runs[0] == runs[1]


_WORKER = textwrap.dedent(
    """
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.path.insert(0, {tests!r})
    import keras
    from conftest import build_mlp, classification_data
    from autoprec.search import Budget, search
    keras.utils.set_random_seed(0)
    model = build_mlp()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = classification_data(samples=192)
    search(model, (x[:128], y[:128]), (x[128:], y[128:]), Budget("val_accuracy", max_drop=0.2),
           hardware="rtx4090", dtypes=["float32", "bfloat16"], n_trials=3, train_steps=2, storage=sys.argv[1], study_name="shared",
           seed=int(sys.argv[2]), verbose=0)
    """
)


@pytest.mark.parametrize("kind", [pytest.param("sqlite", marks=pytest.mark.slow), "journal"])
def test_two_processes_share_one_study(tmp_path, kind):
    import pathlib

    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(tests=str(pathlib.Path(__file__).parent)))
    storage = f"sqlite:///{tmp_path / 'shared.db'}" if kind == "sqlite" else str(tmp_path / "s.log")
    if kind == "sqlite":
        optuna.storages.RDBStorage(storage)  # create the schema once, before the workers
    workers = [
        subprocess.Popen([sys.executable, str(script), storage, str(seed)], stderr=subprocess.PIPE)
        for seed in (1, 2)
    ]
    for worker in workers:
        _, stderr = worker.communicate(timeout=300)
        assert worker.returncode == 0, stderr.decode()[-2000:]
    study = optuna.load_study(study_name="shared", storage=_storage(storage))
    numbers = [t.number for t in study.trials]
    assert len(numbers) == 6 and len(set(numbers)) == 6
    labels = [t.user_attrs["warm_start"] for t in study.trials if "warm_start" in t.user_attrs]
    assert len(labels) == len(set(labels))


def test_heuristic_whole_plan_is_no_slower_than_float32_or_a_uniform_16_bit_plan():
    from autoprec import cost

    inputs = keras.Input((256,))
    hidden = inputs
    for width in (2048, 16, 2048, 16, 2048):  # wide layers pay in 16-bit, narrow ones cast
        hidden = keras.layers.Dense(width, activation="relu")(hidden)
    outputs = keras.layers.Dense(10, activation="softmax")(hidden)
    model = keras.Model(inputs, outputs)
    table = cost.predict_costs(model, "rtx4090", batch_size=256)
    plan = heuristic_plan(model, costs=table, hardware="rtx4090")

    def step(dtypes):
        return cost.estimate(model, dtypes, table, batch_size=256).step_seconds

    chosen = step(dict(plan.layers))
    uniform = {
        path: ("bfloat16" if path.startswith("dense") and path != "dense_5" else "float32")
        for path in plan.layers
    }
    assert chosen <= step({path: "float32" for path in plan.layers}) + 1e-12
    assert chosen <= step(uniform) * 1.0001
    assert plan.layers["dense_5"] == "float32"  # the softmax output stays float32


def test_measured_step_confirms_the_final_plan_against_uniform_plans():
    train, val = mlp_data()
    settings = {**FAST, "hardware": "local", "measure_speedup": True}
    result = search(
        compiled_mlp(), train, val, Budget("val_accuracy", max_drop=0.5), n_trials=4, **settings
    )
    measured = result.plan.metadata["search"]["measured_step_seconds"]
    assert {"searched", "float32"} <= set(measured)
    chosen = result.plan.metadata["search"]["measured_plan_step_seconds"]
    assert chosen <= min(measured.values()) / (1 - 0.03) + 1e-12  # no uniform plan clearly faster
    assert result.plan.metadata["measured_speedup"] == pytest.approx(measured["float32"] / chosen)
