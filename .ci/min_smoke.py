"""Smoke test of the installed autoprec: a fit with a plan, plan files, a 3-trial search, the CLI.

.ci/min_versions.sh runs it against the lowest dependency versions pyproject.toml declares.
It prints the versions it ran with and exits non-zero on the first failure.
"""

from __future__ import annotations

import importlib.metadata
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import keras
import numpy as np

import autoprec

DEPENDENCIES = ("tensorflow", "keras", "numpy", "optuna", "ml_dtypes")


def build_mlp() -> keras.Model:
    """A compiled 3-layer classifier on 8 features."""
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    hidden = keras.layers.Dense(16, activation="relu", name="middle")(hidden)
    outputs = keras.layers.Dense(3, activation="softmax", name="head")(hidden)
    model = keras.Model(inputs, outputs, name="mlp")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def data(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Separable 3-class data."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, 8)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0).astype("int64")


def fit_with_plan(loss_scale: str | float) -> tuple[keras.Model, autoprec.PrecisionPlan, list]:
    """Trains the MLP 2 epochs with a float16 + float32 plan and this loss scale."""
    model = build_mlp()
    plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    x, y = data(256, seed=0)
    callback = autoprec.AutoPrecision(plan, loss_scale=loss_scale, verbose=0)
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[callback])
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)), f"non-finite loss, loss_scale={loss_scale!r}: {losses}"
    assert losses[-1] < losses[0], f"no training progress, loss_scale={loss_scale!r}: {losses}"
    return model, plan, losses


def check_fit_with_plan(folder: Path) -> None:
    """Trains with a float16 + float32 plan (dynamic and fixed loss scale); plan save/load/diff."""
    fit_with_plan(128.0)
    model, plan, losses = fit_with_plan("dynamic")
    assert model.get_layer("hidden").compute_dtype == "float16", model.get_layer(
        "hidden"
    ).dtype_policy
    assert model.get_layer("head").compute_dtype == "float32", model.get_layer("head").dtype_policy
    path = folder / "plan.json"
    plan.save(path)
    loaded = autoprec.PrecisionPlan.load(path)
    assert loaded.to_dict() == plan.to_dict(), "plan changed in a save/load round trip"
    changes = autoprec.PrecisionPlan.uniform(build_mlp(), "float32").diff(loaded)
    assert "hidden" in str(changes) and "head" not in str(changes), str(changes)
    print(
        f"fit with a float16+float32 plan: loss {losses[0]:.3f} -> {losses[-1]:.3f}; save/load/diff ok"
    )


def search_arguments() -> dict:
    """The fewest-steps search arguments, for the search API of this autoprec."""
    if hasattr(autoprec, "SearchSettings"):
        settings = autoprec.SearchSettings(
            batch_size=32, steps_per_trial=2, dtypes=["float32", "bfloat16", "float16"], seed=0
        )
        return {"settings": settings}
    return {"train_steps": 2, "batch_size": 32, "dtypes": ["float32", "bfloat16"], "seed": 0}


def check_search() -> None:
    """Runs a real 3-trial search on the MLP for a predicted GPU (float16 emulated on a CPU)."""
    x, y = data(192, seed=1)
    result = autoprec.search(
        build_mlp(),
        (x[:128], y[:128]),
        (x[128:], y[128:]),
        budget=autoprec.Budget("val_loss", max_relative_drop=0.05),
        hardware="rtx4090",
        n_trials=3,  # float32, uniform bfloat16, uniform float16 (emulated on a CPU)
        verbose=0,
        **search_arguments(),
    )
    assert isinstance(result.plan, autoprec.PrecisionPlan), type(result.plan)
    states = [trial.state.name for trial in result.study.trials]
    assert "FAIL" not in states, f"search trials failed: {states} (see the log above)"
    autoprec.PrecisionPlan.from_json(result.plan.to_json())
    float16_trials = result.plan.metadata.get("search", {}).get("float16_trials")
    print(
        f"3-trial search: trials {states}, plan {result.plan.dtype_counts()}, "
        f"float16 trials {float16_trials}"
    )


def check_cli() -> None:
    """Runs `autoprec --help` from the environment's scripts."""
    script = Path(sys.executable).with_name("autoprec")
    completed = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "search" in completed.stdout, completed.stdout
    print("autoprec --help: ok")


def main() -> None:
    """Prints the versions, runs every check and the time each took."""
    logging.getLogger("autoprec").setLevel(logging.WARNING)
    versions = {name: importlib.metadata.version(name) for name in ("autoprec", *DEPENDENCIES)}
    print("python", sys.version.split()[0], " ".join(f"{k}=={v}" for k, v in versions.items()))
    with tempfile.TemporaryDirectory() as folder:
        for check in (lambda: check_fit_with_plan(Path(folder)), check_search, check_cli):
            start = time.perf_counter()
            check()
            print(f"  ({time.perf_counter() - start:.1f} s)")
    print("minimum-version smoke test passed")


if __name__ == "__main__":
    main()
