"""PlanCallback: a given plan applied inside fit, with loss scaling only where float16 runs (autoprec/runtime/training.py)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import autoprec
from autoprec import PlanError, PrecisionPlan
from autoprec.layers import layer_paths
from autoprec.runtime import FlooredLossScaleOptimizer, PlanCallback


def _compiled(model):
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def test_float16_plan_gets_floored_loss_scaling(mlp, classification):
    x, y = classification
    _compiled(mlp)
    plan = PrecisionPlan.uniform(mlp, "float16").with_dtype("dense_2", "float32")
    callback = PlanCallback(plan, verbose=0)
    history = mlp.fit(x, y, epochs=2, batch_size=32, verbose=0, callbacks=[callback])
    assert isinstance(mlp.optimizer, FlooredLossScaleOptimizer)
    assert history.history["loss_scale"] == [2.0**15, 2.0**15]
    assert layer_paths(mlp)["dense"].compute_dtype == "float16"
    assert layer_paths(mlp)["dense_2"].compute_dtype == "float32"
    assert callback.handle.uses_float16
    assert all(np.isfinite(history.history["loss"]))
    callback.restore()
    assert not isinstance(mlp.optimizer, keras.optimizers.LossScaleOptimizer)
    assert layer_paths(mlp)["dense"].compute_dtype == "float32"


def test_float32_plan_gets_no_loss_scaling(mlp, classification):
    x, y = classification
    _compiled(mlp)
    callback = PlanCallback(PrecisionPlan.uniform(mlp, "float32"), verbose=0)
    history = mlp.fit(x, y, epochs=1, verbose=0, callbacks=[callback])
    assert not isinstance(mlp.optimizer, keras.optimizers.LossScaleOptimizer)
    assert "loss_scale" not in history.history
    assert set(callback.handle.dtypes.values()) == {"float32"}
    assert callback.current_plan() == callback.plan


def test_plan_path_in_and_out_and_the_plan_is_attached(mlp, classification, tmp_path):
    x, y = classification
    _compiled(mlp)
    source = tmp_path / "plan.json"
    PrecisionPlan.uniform(mlp, "bfloat16").save(source)
    saved = tmp_path / "used.json"
    callback = PlanCallback(str(source), plan_path=saved, verbose=0)
    mlp.fit(x, y, epochs=1, verbose=0, callbacks=[callback])
    assert PrecisionPlan.load(saved) == callback.plan
    assert autoprec.runtime.attached_plan(mlp) == callback.plan
    assert layer_paths(mlp)["dense_1"].compute_dtype == "bfloat16"


def test_a_plan_is_required_and_checked(mlp):
    with pytest.raises(PlanError, match="PlanCallback: a plan is required"):
        PlanCallback(None)
    with pytest.raises(PlanError, match="PlanCallback: 'plan' must be a PrecisionPlan"):
        PlanCallback({"dense": "float16"})
    with pytest.raises(PlanError, match="loss_scale=None.*float16"):
        PlanCallback(PrecisionPlan.uniform(mlp, "float16"), loss_scale=None)
    with pytest.raises(TypeError):
        PlanCallback(PrecisionPlan.uniform(mlp, "float16"), "local")  # keyword-only


def test_verbose_prints_the_counts_and_the_loss_scale(mlp, classification, capsys):
    x, y = classification
    _compiled(mlp)
    plan = PrecisionPlan.uniform(mlp, "float16").with_dtype("dense_2", "float32")
    mlp.fit(x, y, epochs=1, verbose=0, callbacks=[PlanCallback(plan)])
    assert "autoprec: plan applied to 1 float32, 3 float16 layer(s); loss scale 32768" in (
        capsys.readouterr().out
    )


def _counting_train_steps(model) -> list:
    """Wraps the model's train step to count how often it is traced; returns the count list."""
    traces = []
    original = model.train_step

    def train_step(data):
        traces.append(1)
        return original(data)

    model.train_step = train_step
    return traces


def test_a_second_fit_reapplies_rechecks_and_retraces_nothing(attention_model, tmp_path):
    x = np.random.default_rng(0).normal(size=(32, 8, 8)).astype("float32")
    y = np.zeros(32, "int32")
    model = _compiled(attention_model)
    traces = _counting_train_steps(model)
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("dense", "float32")
    callback = PlanCallback(plan, verbose=0)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    assert len(traces) == 1
    function, handle = model.train_function, callback.handle
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    again = PlanCallback(plan, verbose=0)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[again])
    assert len(traces) == 1 and model.train_function is function
    assert callback.handle is handle and again.handle is handle  # not re-applied
    # Another plan: applied and traced once; kernels only checked for its new layer dtypes.
    other = plan.with_dtype("attention*", "bfloat16")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[PlanCallback(other, verbose=0)])
    assert len(traces) == 2
    assert layer_paths(model)["attention/query_dense"].compute_dtype == "bfloat16"
    # Outside changes are seen: a recompile resets the functions, so the plan is applied again.
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[PlanCallback(plan, verbose=0)])
    assert len(traces) == 3
    assert isinstance(model.optimizer, FlooredLossScaleOptimizer)
