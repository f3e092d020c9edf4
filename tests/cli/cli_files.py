"""Real files the command-line tests share: a saved compiled model, its data, plans, a run helper."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
from conftest import build_mlp, classification_data

from autoprec import PrecisionPlan

#: Native lines TensorFlow writes while it loads; none may reach the command's stderr.
FRAMEWORK_NOISE = ("tensorflow", "onednn", "cuda", "absl", "cpu_feature_guard")


def run_cli(*arguments: str, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `python -m autoprec ARGUMENTS` in a fresh process, without TF_CPP_MIN_LOG_LEVEL set."""
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, "-m", "autoprec", *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


def write_plan_files(folder: Path) -> tuple[Path, Path]:
    """Writes two plans of `build_mlp()`: all bfloat16, and the same with `dense_2` in float32."""
    plan = PrecisionPlan.uniform(build_mlp(), "bfloat16")
    first, second = folder / "a.json", folder / "b.json"
    plan.save(first)
    plan.with_dtype("dense_2", "float32").save(second)
    return first, second


def write_model_and_data(folder: Path) -> tuple[Path, Path, Path]:
    """Writes a compiled MLP `.keras` file, its `.npz` data and an uncompiled model.

    Returns:
        `(model path, data path, uncompiled model path)`.
    """
    keras.backend.clear_session()  # the state each test starts from (conftest)
    keras.utils.set_random_seed(0)
    model = build_mlp()
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model_path = folder / "model.keras"
    model.save(model_path)
    x, y = classification_data(samples=160)
    data_path = folder / "data.npz"
    np.savez(data_path, x_train=x[:128], y_train=y[:128], x_val=x[128:], y_val=y[128:])
    uncompiled = folder / "uncompiled.keras"
    keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)]).save(uncompiled)
    return model_path, data_path, uncompiled


def write_model_plans(model_path: Path, folder: Path) -> tuple[Path, Path]:
    """Writes a bfloat16 plan that fits the model file, and a plan of another model."""
    fitting, other = folder / "plan.json", folder / "other.json"
    model = keras.saving.load_model(model_path, compile=False)
    PrecisionPlan.uniform(model, "bfloat16").with_dtype(model.layers[-1].name, "float32").save(
        fitting
    )
    foreign = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3, name="other_head")])
    PrecisionPlan.uniform(foreign, "bfloat16").save(other)
    return fitting, other
