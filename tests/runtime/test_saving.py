"""save_model / load_model with the plan inside, and atomic writes that survive a kill (autoprec/runtime/saving.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
from conftest import build_attention_model

import autoprec
from autoprec import PlanError, PrecisionPlan
from autoprec.layers import layer_paths


def _trained_attention_model():
    model = build_attention_model()
    model.compile("adam", "sparse_categorical_crossentropy")
    x = np.random.default_rng(0).normal(size=(32, 8, 8)).astype("float32")
    y = np.zeros(32, "int32")
    plan = (
        PrecisionPlan.uniform(model, "float16")
        .with_dtype("attention/softmax", "float32")
        .with_dtype("dense", "float32")
    )
    model.fit(x, y, epochs=2, verbose=0, callbacks=[autoprec.AutoPrecision(plan, verbose=0)])
    return model, x, y


def test_reload_keeps_nested_dtypes_weights_and_optimizer_state(tmp_path):
    model, x, y = _trained_attention_model()
    path = autoprec.save_model(model, tmp_path / "model.keras")
    restored = autoprec.load_model(path)

    before = {p: layer.compute_dtype for p, layer in layer_paths(model).items()}
    after = {p: layer.compute_dtype for p, layer in layer_paths(restored).items()}
    assert after == before
    assert after["attention/query_dense"] == "float16"  # a nested sub-layer
    for expected, actual in zip(model.get_weights(), restored.get_weights()):
        np.testing.assert_array_equal(expected, actual)
    assert isinstance(restored.optimizer, autoprec.FlooredLossScaleOptimizer)
    assert float(restored.optimizer.dynamic_scale.numpy()) == float(
        model.optimizer.dynamic_scale.numpy()
    )
    original_state = model.optimizer.inner_optimizer.variables
    restored_state = restored.optimizer.inner_optimizer.variables
    assert len(original_state) == len(restored_state)
    for expected, actual in zip(original_state, restored_state):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(expected), keras.ops.convert_to_numpy(actual)
        )
    np.testing.assert_allclose(model.predict(x, verbose=0), restored.predict(x, verbose=0))
    restored.fit(x, y, epochs=1, verbose=0)  # training continues


def test_keras_own_save_reloads_optimizer_state_and_the_plan(tmp_path):
    """Keras' `model.save` (as `ModelCheckpoint` calls it) keeps what training needs."""
    model, x, y = _trained_attention_model()
    model.save(tmp_path / "plain.keras")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # "Skipping variable loading" is a failure
        reloaded = keras.saving.load_model(tmp_path / "plain.keras")
    assert isinstance(reloaded.optimizer, autoprec.FlooredLossScaleOptimizer)
    assert float(reloaded.optimizer.dynamic_scale.numpy()) == float(
        model.optimizer.dynamic_scale.numpy()
    )
    assert int(reloaded.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy())
    for expected, actual in zip(model.optimizer.variables, reloaded.optimizer.variables):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(expected), keras.ops.convert_to_numpy(actual)
        )
    # Keras alone rebuilds nested sub-layers from the policy map their container wrote ...
    assert layer_paths(model)["attention/softmax"].compute_dtype == "float32"
    assert layer_paths(reloaded)["attention/softmax"].compute_dtype == "float32"
    assert layer_paths(reloaded)["attention/query_dense"].compute_dtype == "float16"
    # ... and the plan Keras wrote among the assets is applied by autoprec.load_model.
    restored = autoprec.load_model(tmp_path / "plain.keras")
    assert layer_paths(restored)["attention/softmax"].compute_dtype == "float32"
    assert layer_paths(restored)["attention/query_dense"].compute_dtype == "float16"
    restored.fit(x, y, epochs=1, verbose=0)


def test_save_model_refuses_other_suffix(mlp, tmp_path):
    with pytest.raises(PlanError, match="must end in '.keras'"):
        autoprec.save_model(mlp, tmp_path / "model.h5")


def test_interrupted_plan_save_leaves_previous_file(tmp_path, mlp, monkeypatch):
    path = tmp_path / "plan.json"
    first = PrecisionPlan.uniform(mlp, "bfloat16")
    first.save(path)

    def crash(_descriptor):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        first.with_dtype("dense", "float16").save(path)
    monkeypatch.undo()
    assert PrecisionPlan.load(path) == first
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_sigkill_while_saving_never_leaves_a_broken_plan(tmp_path):
    path = tmp_path / "plan.json"
    PrecisionPlan({"x": "float32"}).save(path)
    script = Path(__file__).resolve().parents[2] / "bench" / "plan_writer.py"
    for delay in (0.05, 0.13, 0.29):
        process = subprocess.Popen(
            [sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True
        )
        assert process.stdout.readline().strip() == "ready"
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait()
        loaded = PrecisionPlan.load(path)  # never truncated, never half-written
        assert loaded.default in ("float32", "bfloat16", "float16")
