"""`autoprec demo`: profile, search, train and time a small built-in model on this device.

The model and its data are generated here (nothing is downloaded). The model is chosen so
that the choice of dtype per layer matters:

- `sensor_proj` reads raw, unnormalised sensor counts; its outputs reach ~1e5, above
  float16's largest value (65504), so uniform `mixed_float16` turns them into `inf`
  and the loss into NaN;
- `wide_1`, `wide_2` are large matmuls, where bfloat16 kernels pay on a CPU with
  AVX512-BF16 or a GPU with tensor cores;
- `narrow` is small: the casts cost more than bfloat16 saves;
- `head` is the softmax classifier, kept in float32.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Any

import keras
import numpy as np

from . import hardware
from ._core.timing import time_interleaved
from .callback import AutoPrecision
from .cost import calibrate
from .plan import PrecisionPlan
from .profiler import Profile, profile
from .search import Budget, SearchResult, SearchSettings, search

_CLASSES = 10
_FEATURES = 256
_WIDE = 512
_SENSOR_SCALE = 40000.0
_POLICIES = ("float32", "plan", "mixed_bfloat16", "mixed_float16")


# ---------------------------------------------------------------------- model and data


def make_data(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Returns generated raw sensor readings and class labels from a fixed random teacher.

    Args:
        samples: number of rows.
        seed: random seed of the readings (the teacher is always the same).

    Returns:
        `(x, y)`: float32 readings in `(-40000, 40000)` of shape `(samples, 256)` and int32
        labels in `[0, 10)`.
    """
    teacher = np.random.default_rng(1234).normal(size=(_FEATURES, _CLASSES))
    rng = np.random.default_rng(seed)
    normalised = rng.uniform(-1.0, 1.0, size=(samples, _FEATURES))
    labels = np.argmax(normalised @ teacher, axis=1).astype("int32")
    readings = (normalised * _SENSOR_SCALE).astype("float32")
    return readings, labels


def build_model(seed: int = 0):
    """Returns the compiled demo classifier (Functional, six compute layers).

    Args:
        seed: weight initialisation seed.

    Returns:
        A compiled `keras.Model` with an accuracy metric.
    """
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((_FEATURES,), name="readings")
    hidden = keras.layers.Dense(64, name="sensor_proj")(inputs)
    hidden = keras.layers.LayerNormalization(name="sensor_norm")(hidden)
    hidden = keras.layers.Dense(_WIDE, activation="relu", name="wide_1")(hidden)
    hidden = keras.layers.Dense(_WIDE, activation="relu", name="wide_2")(hidden)
    hidden = keras.layers.Dense(32, activation="relu", name="narrow")(hidden)
    outputs = keras.layers.Dense(_CLASSES, activation="softmax", name="head")(hidden)
    model = keras.Model(inputs, outputs, name="autoprec_demo")
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


# ---------------------------------------------------------------------- settings


def _settings(quick: bool, trials: int | None) -> dict[str, int]:
    if quick:
        settings = {"train": 1536, "val": 512, "batch": 128, "epochs": 2, "trials": 3}
        settings.update({"search_steps": 8, "rounds": 5, "profile_steps": 2})
    else:
        settings = {"train": 8192, "val": 2048, "batch": 128, "epochs": 4, "trials": 10}
        settings.update({"search_steps": 30, "rounds": 15, "profile_steps": 4})
    if trials is not None:
        settings["trials"] = max(1, int(trials))
    return settings


def _search_dtypes(device) -> list[str]:
    """float32 and bfloat16 on a CPU (TensorFlow runs float16 on fallback kernels there)."""
    if device.kind == "cpu":
        return ["float32", "bfloat16"]
    return ["float32", *[dtype for dtype in ("bfloat16", "float16") if device.is_fast(dtype)]]


# ---------------------------------------------------------------------- stages


def _profile_stage(model, train, settings) -> Profile:
    return profile(model, train, steps=settings["profile_steps"], batch_size=settings["batch"])


def _search_stage(model, train, val, settings, device, profile) -> SearchResult:
    dtypes = _search_dtypes(device)
    batch = (train[0][: settings["batch"]], train[1][: settings["batch"]])
    costs = calibrate(model, batch, dtypes=dtypes, repeats=3, verbose=0)
    return search(
        model,
        train,
        val,
        budget=Budget("val_accuracy", max_drop=0.02),
        n_trials=settings["trials"],
        verbose=0,
        settings=SearchSettings(
            batch_size=settings["batch"],
            steps_per_trial=settings["search_steps"],
            dtypes=dtypes,
            profile=profile,
            costs=costs,
            measure_speedup=False,
            seed=0,
        ),
    )


def _candidate_plans(plan: PrecisionPlan) -> dict[str, PrecisionPlan | str]:
    """The plan, and the baselines as Keras' own global policy names."""
    return {
        "float32": "float32",
        "plan": plan,
        "mixed_bfloat16": "mixed_bfloat16",
        "mixed_float16": "mixed_float16",
    }


@contextlib.contextmanager
def keras_global_policy(name: str):
    """Builds models under Keras' global dtype policy `name`, restoring the previous one after.

    A model built and compiled here runs exactly as Keras runs that policy: every
    layer in it, and for `mixed_float16` the `LossScaleOptimizer` that `compile` adds.

    Args:
        name: a Keras dtype policy name (`"float32"`, `"mixed_bfloat16"`, `"mixed_float16"`).

    Example:

    ```python
    with keras_global_policy("mixed_float16"):
        model = build_model()
    ```
    """
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _train_all(plans: dict[str, Any], initial_weights, data, settings) -> dict[str, dict]:
    """Trains a fresh copy of the model under each plan or Keras policy from the same weights.

    The plan trains through `AutoPrecision`; each baseline is a model built under Keras'
    own global policy and trained as Keras trains it, without autoprec, so a baseline
    reported as diverged diverged under plain Keras.
    """
    (x, y), (x_val, y_val) = data
    models, results = {}, {}
    for name, plan in plans.items():
        if isinstance(plan, str):
            with keras_global_policy(plan):
                model = build_model()
            callbacks = [keras.callbacks.TerminateOnNaN()]
        else:
            model = build_model()
            callbacks = [AutoPrecision(plan, verbose=0), keras.callbacks.TerminateOnNaN()]
        model.set_weights(initial_weights)
        history = model.fit(
            x,
            y,
            batch_size=settings["batch"],
            epochs=settings["epochs"],
            shuffle=False,
            verbose=0,
            callbacks=callbacks,
        )
        losses = history.history.get("loss", [math.nan])
        finite = bool(model.stop_training is False and all(map(math.isfinite, losses)))
        evaluation = model.evaluate(x_val, y_val, batch_size=512, verbose=0, return_dict=True)
        results[name] = {
            "uniform_float32": plan == "float32"
            or (not isinstance(plan, str) and set(plan.layers.values()) == {"float32"}),
            "val_accuracy": float(evaluation["accuracy"]) if finite else math.nan,
            "loss": float(losses[-1]),
            "finite": finite,
        }
        models[name] = model
    return {"models": models, "results": results}


def _time_steps(models: dict[str, Any], initial_weights, batch, rounds: int) -> dict[str, float]:
    """Median train-step seconds per model, timed side by side in interleaved rounds.

    The order rotates every round. A policy whose warm-up step is over 10x slower than
    the fastest (float16 on fallback kernels) is timed apart, with at most 3 steps,
    so it neither dominates the run time nor slows the steps timed right after it.
    """
    x, y = batch
    for model in models.values():
        model.set_weights(initial_weights)
    steps = {name: (lambda model=model: _one_step(model, x, y)) for name, model in models.items()}
    timings = time_interleaved(
        steps, rounds=rounds, warmup=2, slow_factor=10, slow_rounds=min(rounds, 3)
    )
    return {name: timing.median for name, timing in timings.items()}


def _one_step(model, x, y) -> None:
    logs = model.train_on_batch(x, y, return_dict=True)
    float(next(iter(logs.values())))


# ---------------------------------------------------------------------- printing


def _layer_table(plan, profile, costs_evidence: dict) -> str:
    headers = ("layer", "class", "max |x|", "f16 fits", "f32 ms", "bf16 ms", "chosen")
    rows = []
    for path, dtype in plan.layers.items():
        info = plan.layer_info.get(path)
        layer_profile = profile.layers.get(path) if profile is not None else None
        seconds = costs_evidence.get(path, {}).get("seconds", {})
        activation = layer_profile.activation if layer_profile is not None else None
        rows.append(
            (
                path,
                info.class_name if info else "?",
                f"{activation.max_abs:.3g}" if activation is not None else "-",
                _yes_no(layer_profile.float16_safe) if layer_profile is not None else "-",
                _milliseconds(seconds.get("float32")),
                _milliseconds(seconds.get("bfloat16")),
                dtype,
            )
        )
    return _table(headers, rows)


def _yes_no(value: bool) -> str:
    return "yes" if value else "NO"


def _milliseconds(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(row[i])) for row in (headers, *rows)) for i in range(len(headers))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(headers, widths))]
    lines.append("  ".join("-" * width for width in widths))
    lines += ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def _results_table(results: dict[str, dict], step_seconds: dict[str, float]) -> str:
    headers = ("policy", "val_accuracy", "final loss", "step ms", "plan speedup vs it")
    rows = []
    for name in _POLICIES:
        result = results[name]
        accuracy = f"{result['val_accuracy']:.3f}" if result["finite"] else "diverged"
        rows.append(
            (
                name,
                accuracy,
                f"{result['loss']:.4g}",
                f"{step_seconds[name] * 1e3:.1f}",
                "-" if name == "plan" else f"{step_seconds[name] / step_seconds['plan']:.2f}x",
            )
        )
    return _table(headers, rows)


def _verdicts(results: dict[str, dict], step_seconds: dict[str, float]) -> list[str]:
    lines = []
    for name in ("float32", "mixed_bfloat16", "mixed_float16"):
        ratio = step_seconds[name] / step_seconds["plan"]
        if name == "float32" and _same_plan(results):
            lines.append("the plan is uniform float32: no layer ran faster in 16-bit here.")
        elif not results[name]["finite"]:
            lines.append(f"{name}: training diverged (NaN loss); the plan trains finitely.")
        elif ratio < 0.98:
            lines.append(
                f"{name} is faster than the plan on this device ({1 / ratio:.2f}x); "
                "the plan's costs were measured per layer, the whole step differs."
            )
        elif ratio > 1.02:
            lines.append(f"the plan is {ratio:.2f}x faster than {name}.")
        else:
            lines.append(f"the plan and {name} run at the same speed (within 2%).")
    return lines


def _same_plan(results: dict[str, dict]) -> bool:
    return bool(results["plan"].get("uniform_float32"))


def _figures(results, step_seconds, plan_path, wall_seconds, trials) -> dict[str, Any]:
    return {
        "metric": "val_accuracy",
        "float32_metric": results["float32"]["val_accuracy"],
        "plan_metric": results["plan"]["val_accuracy"],
        "metrics": {name: results[name]["val_accuracy"] for name in _POLICIES},
        "finite": {name: results[name]["finite"] for name in _POLICIES},
        "step_seconds": dict(step_seconds),
        "speedup_over": {
            name: step_seconds[name] / step_seconds["plan"] for name in _POLICIES if name != "plan"
        },
        "plan_path": str(plan_path),
        "trials": trials,
        "wall_seconds": wall_seconds,
    }


# ---------------------------------------------------------------------- entry point


def _quiet_tensorflow() -> None:
    """Silences TensorFlow's retracing warnings: every policy is traced on purpose."""
    try:
        import tensorflow as tf
    except ImportError:
        return
    tf.get_logger().setLevel("ERROR")


def run_demo(
    output: str | os.PathLike = "plan.json", quick: bool = False, n_trials: int | None = None
) -> dict[str, Any]:
    """Profiles, searches, trains and times the built-in demo model, printing each result.

    Args:
        output: where the plan is written (atomically, with `PrecisionPlan.save`).
        quick: a smaller run (under a minute on two CPU cores).
        n_trials: search trials (default 10, or 3 with `quick`).

    Returns:
        The printed figures: `float32_metric`, `plan_metric`, `metrics` and `finite` per
        policy, `step_seconds` per policy, `speedup_over` (the plan's speedup over each
        other policy), `plan_path`, `trials`, `wall_seconds`.

    Example:

    ```python
    figures = autoprec.demo.run_demo("plan.json", quick=True)
    figures["speedup_over"]["float32"]
    ```
    """
    _quiet_tensorflow()
    started = time.perf_counter()
    settings = _settings(quick, n_trials)
    device = hardware.detect()
    train = make_data(settings["train"], seed=0)
    val = make_data(settings["val"], seed=1)
    model = build_model()
    initial_weights = model.get_weights()
    print(
        f"autoprec demo: {model.name}, {model.count_params():,} parameters, "
        f"{settings['train']} generated samples, on {device.display_name} ({device.kind})"
    )

    profile = _profile_stage(model, train, settings)
    unsafe = ", ".join(profile.float16_unsafe_layers) or "none"
    print(f"[1/3] profiled {settings['profile_steps']} steps; float16 does not fit: {unsafe}")

    result = _search_stage(model, train, val, settings, device, profile)
    plan = result.plan
    plan.save(output)
    print(
        f"[2/3] searched {len(result.study.trials)} trials over "
        f"{'/'.join(_search_dtypes(device))} (budget: val_accuracy drop <= 0.02); "
        f"plan written to {output}"
    )
    print(_layer_table(plan, profile, plan.metadata.get("evidence", {})))

    trained = _train_all(_candidate_plans(plan), initial_weights, (train, val), settings)
    batch = (train[0][: settings["batch"]], train[1][: settings["batch"]])
    step_seconds = _time_steps(trained["models"], initial_weights, batch, settings["rounds"])
    print(
        f"[3/3] trained {settings['epochs']} epochs per policy from the same weights; "
        f"train step timed side by side (batch {settings['batch']}, median of "
        f"{settings['rounds']} interleaved rounds)"
    )
    print(_results_table(trained["results"], step_seconds))
    for line in _verdicts(trained["results"], step_seconds):
        print("  " + line)
    wall_seconds = time.perf_counter() - started
    print(f"done in {wall_seconds:.0f} s")
    return _figures(
        trained["results"], step_seconds, output, wall_seconds, len(result.study.trials)
    )
