"""`autoprec demo`: profile, search, train and time a built-in model on this device.

The models and their data are generated here; nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np

from .. import hardware
from .._core.io import atomic_write_json
from .._core.timing import Timing, time_interleaved
from ..callback import AutoPrecision
from ..cost import calibrate, estimate, predict_costs
from ..plan import PrecisionPlan
from ..profiler import Profile, profile
from ..search import Budget, SearchResult, SearchSettings, search
from .report import NOISE, POLICIES, host_text, layer_table, results_table, verdicts
from .report import Comparison as Comparison
from .report import budget_status as budget_status
from .report import compare as compare
from .report import paired_rounds as paired_rounds
from .report import rounds_needed as rounds_needed
from .report import speed_relation as speed_relation

_CLASSES = 10
_FEATURES = 256
_WIDE = 512
_SENSOR_SCALE = 40000.0

_STEPS = 64
_CHANNELS = 16
_COUNTS_SCALE = 100000.0
_PRESSURE_HPA = 1013.25
_SIGNAL_HPA = 3.0
_PRESSURE_WIDE = 1024


def make_pressure_data(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Returns generated raw sensor traces and the absolute pressure they read, in hPa.

    Args:
        samples: number of traces.
        seed: random seed of the traces (the read-out is always the same).

    Returns:
        `(x, y)`: float32 counts in `(-100000, 100000)` of shape `(samples, 64, 16)`
        (64 time steps, 16 channels) and float32 pressures of shape `(samples, 1)`,
        1013.25 hPa plus a linear read-out of the channels' time averages (about 3 hPa
        standard deviation).

    Example:

    ```python
    x, y = autoprec.demo.make_pressure_data(256)
    x.shape, y.shape  # (256, 64, 16), (256, 1)
    ```
    """
    read_out = np.random.default_rng(1234).normal(size=(_CHANNELS,))
    read_out /= np.linalg.norm(read_out)
    rng = np.random.default_rng(seed)
    normalised = rng.uniform(-1.0, 1.0, size=(samples, _STEPS, _CHANNELS))
    signal = (normalised.mean(axis=1) @ read_out) * math.sqrt(3 * _STEPS)
    pressure = _PRESSURE_HPA + _SIGNAL_HPA * signal
    counts = (normalised * _COUNTS_SCALE).astype("float32")
    return counts, pressure.astype("float32")[:, None]


def build_pressure_model(seed: int = 0) -> keras.Model:
    """Returns the compiled demo regressor of `autoprec demo` (Functional, eight compute layers).

    Args:
        seed: weight initialisation seed.

    Returns:
        A compiled `keras.Model` named `"autoprec_demo"`.

    Example:

    ```python
    model = autoprec.demo.build_pressure_model()
    model.fit(*autoprec.demo.make_pressure_data(512), epochs=1, verbose=0)
    ```
    """
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((_STEPS, _CHANNELS), name="counts")
    hidden = keras.layers.Dense(64, name="sensor_proj")(inputs)
    hidden = keras.layers.LayerNormalization(name="sensor_norm")(hidden)
    hidden = keras.layers.DepthwiseConv1D(5, padding="same", name="smooth")(hidden)
    hidden = keras.layers.AveragePooling1D(4, name="pool")(hidden)
    hidden = keras.layers.Flatten(name="flat")(hidden)
    for index in (1, 2, 3):
        hidden = keras.layers.Dense(_PRESSURE_WIDE, activation="relu", name=f"wide_{index}")(hidden)
    hidden = keras.layers.Dense(32, activation="relu", name="narrow")(hidden)
    outputs = keras.layers.Dense(
        1, name="head", bias_initializer=keras.initializers.Constant(_PRESSURE_HPA)
    )(hidden)
    model = keras.Model(inputs, outputs, name="autoprec_demo")
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", metrics=["mae"])
    return model


def make_data(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Returns generated raw sensor readings and class labels from a fixed random teacher.

    Args:
        samples: number of rows.
        seed: random seed of the readings (the teacher is always the same).

    Returns:
        `(x, y)`: float32 readings in `(-40000, 40000)` of shape `(samples, 256)` and int32
        labels in `[0, 10)`.

    Example:

    ```python
    x, y = autoprec.demo.make_data(1024)
    x.shape, y.shape  # (1024, 256), (1024,)
    ```
    """
    teacher = np.random.default_rng(1234).normal(size=(_FEATURES, _CLASSES))
    rng = np.random.default_rng(seed)
    normalised = rng.uniform(-1.0, 1.0, size=(samples, _FEATURES))
    labels = np.argmax(normalised @ teacher, axis=1).astype("int32")
    readings = (normalised * _SENSOR_SCALE).astype("float32")
    return readings, labels


def build_model(seed: int = 0) -> keras.Model:
    """Returns the compiled demo classifier of the tutorial (Functional, six compute layers).

    Args:
        seed: weight initialisation seed.

    Returns:
        A compiled `keras.Model` with an accuracy metric.

    Example:

    ```python
    model = autoprec.demo.build_model()
    model.fit(*autoprec.demo.make_data(1024), epochs=1, verbose=0)
    ```
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


#: The compute dtype of each uniform policy, as `autoprec.estimate` takes it.
_UNIFORM_DTYPES = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}
#: The demo's budget: the plan's validation MSE may be at most this fraction above float32's.
BUDGET = Budget("val_loss", max_relative_drop=0.5)
#: Batch size of the card prediction: a card this size is launch-bound at the CPU's batch.
CARD_BATCH = 1024


def _settings(quick: bool, trials: int | None) -> dict[str, int]:
    if quick:
        settings = {"train": 1024, "val": 256, "batch": 32, "epochs": 1, "trials": 1}
        settings.update({"search_steps": 32, "rounds": 3, "profile_steps": 1, "measure": 0})
    else:
        settings = {"train": 4096, "val": 1024, "batch": 128, "epochs": 3, "trials": 6}
        settings.update({"search_steps": 32, "rounds": 20, "profile_steps": 2, "measure": 1})
    if trials is not None:
        settings["trials"] = max(1, int(trials))
    return settings


def _search_dtypes(device) -> list[str]:
    """float32 and bfloat16 on a CPU (TensorFlow runs float16 on fallback kernels there)."""
    if device.kind == "cpu":
        return ["float32", "bfloat16"]
    return ["float32", *[dtype for dtype in ("bfloat16", "float16") if device.is_fast(dtype)]]


def describe_host() -> dict[str, Any]:
    """Returns what decides 16-bit speed on this machine: CPU model, cores, 16-bit flags.

    Returns:
        `{"cpu": model name, "cores": logical cores, "flags": {"avx512_bf16": bool,
        "amx_bf16": bool, "avx512_fp16": bool, "amx_fp16": bool}}`.

    Example:

    ```python
    autoprec.demo.describe_host()["flags"]["avx512_bf16"]
    ```
    """
    return {
        "cpu": hardware.detect_cpu().display_name,
        "cores": os.cpu_count() or 1,
        "flags": dict(hardware.cpu_flags()),
    }


@contextlib.contextmanager
def keras_global_policy(name: str):
    """Builds models under Keras' global dtype policy `name`, restoring the previous one after.

    Args:
        name: a Keras dtype policy name (`"float32"`, `"mixed_bfloat16"`, `"mixed_float16"`).

    Example:

    ```python
    with keras_global_policy("mixed_float16"):
        model = build_pressure_model()
    ```
    """
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _search_plan(model, data, settings, device, profile_: Profile, output) -> SearchResult:
    """Step 2 of 3: searches a plan, saves it to `output`, prints it with its costs' source."""
    (train, val), dtypes = data, _search_dtypes(device)
    if settings["measure"]:
        batch = (train[0][: settings["batch"]], train[1][: settings["batch"]])
        costs = calibrate(model, batch, dtypes=dtypes, repeats=5, verbose=0)
        source = (
            "per-layer costs measured on this device by calibrate "
            f"({costs.stats.get('timed', 0)} timed now, {costs.stats.get('cached', 0)} from its cache)"
        )
    else:
        costs = predict_costs(model, device, batch_size=settings["batch"], dtypes=dtypes)
        source = f"per-layer costs predicted from the {device.display_name} profile (--quick)"
    settings_ = SearchSettings(
        batch_size=settings["batch"], steps_per_trial=settings["search_steps"], dtypes=dtypes,
        profile=profile_, costs=costs, measure_speedup=False, confirm_steps=0, seed=0,
    )  # fmt: skip
    optuna_logger = logging.getLogger("optuna")  # no Optuna line per trial in the output
    previous = optuna_logger.level
    optuna_logger.setLevel(logging.WARNING)
    try:
        result = search(
            model, train, val, budget=BUDGET, n_trials=settings["trials"], verbose=0,
            settings=settings_,
        )  # fmt: skip
    finally:
        optuna_logger.setLevel(previous)
    result.plan.save(output)
    print(
        f"[2/3] searched {len(result.study.trials)} trials over {'/'.join(dtypes)} "
        f"(budget: {BUDGET.metric} at most {BUDGET.max_relative_drop:.0%} above float32's); "
        f"plan written to {output}"
    )
    print(f"      {source}:")
    print(layer_table(result.plan, profile_, result.plan.metadata.get("evidence", {})))
    return result


def _train_all(plan: PrecisionPlan, initial_weights, data, settings) -> dict[str, dict]:
    """Trains a fresh copy of the model under the plan and each Keras policy, same weights."""
    (x, y), (x_val, y_val) = data
    models, results = {}, {}
    for name in POLICIES:
        if name == "plan":
            model = build_pressure_model()
            callbacks = [AutoPrecision(plan, verbose=0), keras.callbacks.TerminateOnNaN()]
        else:
            with keras_global_policy(name):
                model = build_pressure_model()
            callbacks = [keras.callbacks.TerminateOnNaN()]
        model.set_weights(initial_weights)
        history = model.fit(
            x, y, batch_size=settings["batch"], epochs=settings["epochs"], shuffle=False,
            verbose=0, callbacks=callbacks,
        )  # fmt: skip
        losses = history.history.get("loss", [math.nan])
        finite = bool(model.stop_training is False and all(map(math.isfinite, losses)))
        evaluation = model.evaluate(x_val, y_val, batch_size=512, verbose=0, return_dict=True)
        metric = float(evaluation[BUDGET.log_name])
        results[name] = {
            "uniform_float32": name == "float32"
            or (name == "plan" and set(plan.layers.values()) == {"float32"}),
            "val_metric": metric if finite and math.isfinite(metric) else math.nan,
            "loss": float(losses[-1]),
            "finite": finite,
        }
        models[name] = model
    return {"models": models, "results": results}


def _time_steps(models: dict[str, Any], initial_weights, batch, rounds: int) -> dict[str, Timing]:
    """Train-step seconds per model, timed side by side in interleaved rounds."""
    x, y = batch
    for model in models.values():
        model.set_weights(initial_weights)

    def one_step(model) -> None:
        logs = model.train_on_batch(x, y, return_dict=True)
        float(next(iter(logs.values())))

    steps = {name: (lambda model=model: one_step(model)) for name, model in models.items()}
    return time_interleaved(
        steps, rounds=rounds, warmup=2, slow_factor=10, slow_rounds=min(rounds, 3)
    )


def _predict(model, plan: PrecisionPlan, target, batch_size: int) -> dict[str, Any] | None:
    """Predicted step seconds of every policy on `target` (a hardware profile), or `None`."""
    if target is None:
        return None
    profile_ = hardware.resolve_hardware(target)
    steps = {}
    for name in POLICIES:
        planned = plan if name == "plan" else _UNIFORM_DTYPES[name]
        steps[name] = estimate(model, planned, profile_, batch_size=batch_size).step_seconds
    return {
        "hardware": profile_.name,
        "device": profile_.display_name,
        "batch_size": batch_size,
        "step_seconds": steps,
        "speedup_over": _ratios(steps),
    }


def _ratios(step_seconds: Mapping[str, float]) -> dict[str, float]:
    """`{policy: its step over the plan's}` for every policy but the plan."""
    return {name: step_seconds[name] / step_seconds["plan"] for name in POLICIES if name != "plan"}


def _figures(results, timings, plan, context: Mapping[str, Any]) -> dict[str, Any]:
    """The run's figures: what every printed sentence is read from (JSON-ready)."""
    step_seconds = {name: timings[name].median for name in POLICIES}
    step_minimum = {name: timings[name].minimum for name in POLICIES}
    reference = results["float32"]["val_metric"]
    return {
        "metric": BUDGET.metric,
        "mode": BUDGET.mode,
        "float32_metric": reference,
        "plan_metric": results["plan"]["val_metric"],
        "metrics": {name: results[name]["val_metric"] for name in POLICIES},
        "finite": {name: results[name]["finite"] for name in POLICIES},
        "losses": {name: results[name]["loss"] for name in POLICIES},
        "budget": {
            **BUDGET.to_dict(),
            "threshold": BUDGET.threshold(reference) if math.isfinite(reference) else math.nan,
        },
        "step_seconds": step_seconds,
        "step_seconds_min": step_minimum,
        "step_samples": {name: list(timings[name].samples) for name in POLICIES},
        "speedup_over": _ratios(step_seconds),
        "speedup_over_min": _ratios(step_minimum),
        "noise": NOISE,
        "plan_uniform_float32": bool(results["plan"]["uniform_float32"]),
        "plan_layers": dict(plan.layers),
        **context,
    }


def _json_ready(value: Any) -> Any:
    """`value` with non-finite floats as `None` (strict JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(key): _json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(item) for item in value]
    return value


def run_demo(
    output: str | os.PathLike = "plan.json",
    quick: bool = False,
    n_trials: int | None = None,
    *,
    predict_for: str | hardware.HardwareProfile | None = "rtx4090",
    figures_path: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Profiles, searches, trains and times the built-in demo model, printing each result.

    Args:
        output: where the plan is written (atomically, with `PrecisionPlan.save`).
        quick: a smaller run (well under a minute on two CPU cores).
        n_trials: search trials (default 8, or 3 with `quick`).
        predict_for: a hardware profile name (or `HardwareProfile`) whose predicted step
            times (`autoprec.estimate`) are shown beside the measured ones; `None` for none.
        figures_path: where to write the returned figures as JSON (non-finite numbers as
            `null`); `None` writes none.

    Returns:
        The figures: `metric` (`"val_loss"`, the validation MSE in hPa²), `mode`,
        `float32_metric`, `plan_metric`, `metrics`, `finite`, `losses` per policy,
        `budget` (with its `threshold`), `step_seconds` (median) and `step_seconds_min`
        per policy, `step_samples`, `speedup_over` (each policy's median step over the
        plan's) and `speedup_over_min`, `noise`, `timing`, `host`, `predicted` (or
        `None`), `plan_layers`, `plan_uniform_float32`, `plan_path`, `trials`,
        `wall_seconds` and the printed `verdicts`.

    Example:

    ```python
    figures = autoprec.demo.run_demo("plan.json", quick=True)
    figures["speedup_over"]["float32"], figures["verdicts"][-1]
    ```
    """
    try:  # every policy is traced on purpose: no retracing warnings
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")
    except ImportError:
        pass
    started = time.perf_counter()
    settings = _settings(quick, n_trials)
    device = hardware.detect()
    host = describe_host()
    train = make_pressure_data(settings["train"], seed=0)
    val = make_pressure_data(settings["val"], seed=1)
    model = build_pressure_model()
    initial_weights = model.get_weights()
    print(
        f"autoprec demo: {model.name}, {model.count_params():,} parameters, "
        f"{settings['train']} generated sensor traces -> pressure (hPa), on {device.display_name} "
        f"({device.kind})"
    )
    print(f"host: {host_text(host)}")
    profile_ = profile(
        model, train, steps=settings["profile_steps"], batch_size=settings["batch"], verbose=0
    )
    unsafe = ", ".join(profile_.float16_unsafe_layers) or "none"
    print(f"[1/3] profiled {settings['profile_steps']} steps; float16 does not fit: {unsafe}")
    result = _search_plan(model, (train, val), settings, device, profile_, output)
    trained = _train_all(result.plan, initial_weights, (train, val), settings)
    batch = (train[0][: settings["batch"]], train[1][: settings["batch"]])
    timings = _time_steps(trained["models"], initial_weights, batch, settings["rounds"])
    timed_apart = [name for name in POLICIES if len(timings[name].samples) < settings["rounds"]]
    context = {
        "timing": {
            "batch_size": settings["batch"],
            "rounds": settings["rounds"],
            "timed_apart": timed_apart,
        },
        "host": host,
        "predicted": _predict(model, result.plan, predict_for, CARD_BATCH),
        "device": {"name": device.display_name, "kind": device.kind},
        "layer_costs": "measured" if settings["measure"] else "predicted",
        "plan_path": str(output),
        "trials": len(result.study.trials),
    }
    figures = _figures(trained["results"], timings, result.plan, context)
    _print_results(figures, settings, host, timed_apart)
    figures["wall_seconds"] = time.perf_counter() - started
    if figures_path is not None:
        atomic_write_json(figures_path, _json_ready(figures))
        print(f"figures written to {figures_path}")
    print(f"done in {figures['wall_seconds']:.0f} s")
    return figures


def _print_results(figures: dict[str, Any], settings, host, timed_apart: list[str]) -> None:
    """Step 3 of 3: prints the training and timing, the results table and the verdicts."""
    apart = f"; {', '.join(timed_apart)} timed apart (over 10x slower)" if timed_apart else ""
    print(
        f"[3/3] trained {settings['epochs']} epochs per policy from the same weights; "
        f"train steps timed side by side in one process (batch {settings['batch']}, "
        f"{settings['rounds']} interleaved rounds{apart}) on {host_text(host)}"
    )
    print(results_table(figures))
    figures["verdicts"] = verdicts(figures)
    for line in figures["verdicts"]:
        print("  " + line)
