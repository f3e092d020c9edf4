"""Tests for autoprec.decision.race: the plans whose whole train step is timed inside fit, and the one kept."""

from __future__ import annotations

import keras
import numpy as np
from conftest import build_attention_model, classification_data, local_with_fast_bfloat16
from decision.auto_models import mlp, mlp_data

from autoprec import AutoPrecision, PrecisionPlan
from autoprec._core.timing import judge_rounds
from autoprec.callback import AutoPlan
from autoprec.decision import UNPROFILED_STEPS, race_candidates, race_traces
from autoprec.hardware import resolve_hardware


def test_race_candidates_are_uniform_as_keras_sets_them_and_the_per_layer_plan():
    model = mlp()
    model(np.zeros((1, 64), "float32"))
    plan = PrecisionPlan.uniform(model, "float32").with_dtype("hidden", "bfloat16")
    cpu = resolve_hardware("cpu-avx512-bf16")
    assert cpu.is_fast("bfloat16") and not cpu.is_fast("float16")
    candidates = race_candidates(model, plan, None, cpu)
    assert list(candidates) == ["float32", "mixed_bfloat16", "per-layer"]
    # A classification loss: every layer as Keras' global mixed_bfloat16 sets it.
    assert set(candidates["mixed_bfloat16"].resolve().values()) == {"bfloat16"}
    assert candidates["per-layer"] is plan
    # A regression loss: the output layer stays float32 in the uniform plan.
    model.compile("adam", "mse")
    uniform = race_candidates(model, plan, None, cpu)["mixed_bfloat16"].resolve()
    assert uniform["head"] == "float32" and uniform["hidden"] == "bfloat16"
    # A per-layer plan that is one of the uniform ones is timed once, under the simpler name.
    assert list(race_candidates(model, PrecisionPlan.uniform(model, "float32"), None, cpu)) == [
        "float32",
        "mixed_bfloat16",
    ]
    # float16 only where it is fast and a profile shows every layer's ranges fit it.
    assert "mixed_float16" not in race_candidates(model, plan, None, resolve_hardware("rtx4090"))


class StepFunctions(keras.callbacks.Callback):
    """Keeps the compiled train function in place after each step (the objects, kept alive)."""

    def __init__(self):
        super().__init__()
        self.seen: list = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(self.model.train_function)


def test_the_race_traces_each_plan_that_changes_a_dtype():
    model = mlp()
    model(np.zeros((1, 64), "float32"))
    cpu = resolve_hardware("cpu-avx512-bf16")
    plan = PrecisionPlan.uniform(model, "float32").with_dtype("hidden", "bfloat16")
    candidates = race_candidates(model, plan, None, cpu)
    # float32 runs the step fit traced; mixed_bfloat16 and the per-layer plan one each; the
    # plan kept runs on its race trace.
    assert race_traces(model, candidates) == 2
    assert race_traces(model, candidates, reuse_fit_step=False) == 3
    assert race_traces(model, {"float32": candidates["float32"]}) == 0
    # A model built under mixed_bfloat16: float32 is the plan that needs its trace.
    for layer in model.layers:
        layer.dtype_policy = "mixed_bfloat16"
    assert (
        race_traces(model, {name: candidates[name] for name in ("float32", "mixed_bfloat16")}) == 1
    )


def test_the_one_liner_keeps_the_plan_whose_whole_step_measured_fastest(capsys):
    model = mlp()
    x, y = mlp_data()
    callback = AutoPrecision(
        hardware=local_with_fast_bfloat16(),
        auto=AutoPlan(profile_steps=2, decision_seconds=120.0),  # time to trace and race
    )
    functions = StepFunctions()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback, functions])
    measured = callback.plan.metadata["measured"]
    names = list(measured["rounds_ms"])
    assert names[0] == "float32" and len(names) >= 2
    assert measured["rounds"] >= 5
    # Float32 runs fit's own trace though the race runs the guard's step-skipping optimizer:
    # each 16-bit candidate is traced once, and the plan kept runs on its race trace.
    assert measured["traces"] == len(names) - 1
    distinct = {id(function): function for function in functions.seen}
    # Fit's own function, then one per 16-bit candidate, none after the race.
    assert len(distinct) == 1 + measured["traces"]
    # The kept plan is the verdict on the recorded rounds, and it is what the model runs.
    verdict = judge_rounds(measured["rounds_ms"], names.index)
    assert measured["winner"] == verdict.leader
    assert (functions.seen[-1] is functions.seen[0]) == (verdict.leader == "float32")
    if verdict.leader == "float32":
        assert set(callback.handle.dtypes.values()) == {"float32"}
    elif verdict.leader == "mixed_bfloat16":
        assert set(callback.handle.dtypes.values()) == {"bfloat16"}
    assert all(np.isfinite(w).all() for w in model.get_weights())
    printed = capsys.readouterr().out
    assert "timed the whole train step of float32" in printed
    assert f"keeping {verdict.leader}" in printed


def test_the_one_liner_times_nothing_where_costs_are_predicted_or_timing_is_off():
    x, y = mlp_data(256)
    for callback in (
        AutoPrecision(hardware="rtx4090", auto=AutoPlan(profile_steps=2), verbose=0),
        AutoPrecision(
            hardware=local_with_fast_bfloat16(),
            auto=AutoPlan(profile_steps=2, timing_rounds=0),
            verbose=0,
        ),
    ):
        model = mlp()
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
        decision = callback.plan.metadata["measured"]
        assert decision["candidates_timed"] == 0 and decision["rounds"] == 0
        assert "winner" not in decision


def test_a_decision_over_a_transformer_traces_each_16bit_candidate_once_and_keeps_its_trace():
    model = build_attention_model()
    model.compile("adam", "sparse_categorical_crossentropy")
    optimizer = model.optimizer
    x, y = classification_data(samples=1024, input_dim=64, classes=2)
    x = x.reshape(1024, 8, 8)  # 64 steps an epoch: the race's rounds end in the first
    callback = AutoPrecision(
        hardware=local_with_fast_bfloat16(),
        auto=AutoPlan(profile_steps=2, decision_seconds=120.0),
    )
    functions = StepFunctions()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[callback, functions])
    measured = callback.plan.metadata["measured"]
    # Float32 runs on fit's own trace, though the guard wraps the optimizer for the race.
    assert measured["traces"] == measured["candidates_timed"] - 1 >= 1, measured
    traced = {id(function) for function in functions.seen}
    # Fit's own function, then one per 16-bit candidate, and none after the race:
    # the plan kept runs on its race trace, as `race_traces` counted.
    assert len(traced) == 1 + measured["traces"]
    fits_own = functions.seen[0]
    raced = functions.seen[UNPROFILED_STEPS : UNPROFILED_STEPS + measured["steps"]]
    assert any(function is fits_own for function in raced)  # float32's steps in the race
    assert any(function is functions.seen[-1] for function in raced)
    if measured["winner"] == "float32":  # fit's step as traced runs on, the guard's wrapper gone
        assert functions.seen[-1] is fits_own and model.optimizer is optimizer
    else:
        assert functions.seen[-1] is not fits_own and model.optimizer is not optimizer
