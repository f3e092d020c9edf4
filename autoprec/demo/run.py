"""The demo's run: profile, search, train and time the demo model, and print each result."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import keras

from .. import hardware
from .._core.io import atomic_write_json
from .._core.timing import Timing, time_interleaved
from ..callback import AutoPrecision
from ..cost import calibrate, estimate, predict_costs
from ..plan import PrecisionPlan
from ..profiler import Profile, profile
from ..search import Budget, SearchResult, SearchSettings, search
from .model import build_pressure_model, make_pressure_data
from .report import NOISE, POLICIES, host_text, layer_table, results_table, verdicts

#: The compute dtype of each uniform policy, as `autoprec.estimate` takes it.
_UNIFORM_DTYPES = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}
#: The demo's budget: the plan's validation MSE may be at most this fraction above float32's.
BUDGET = Budget("val_loss", max_relative_drop=0.5)
#: Batch size of the card prediction: a card this size is launch-bound at the CPU's batch.
CARD_BATCH = 1024


# ---------------------------------------------------------------------- settings


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


# ---------------------------------------------------------------------- host


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


# ---------------------------------------------------------------------- stages


def _profile_stage(model, train, settings) -> Profile:
    return profile(
        model, train, steps=settings["profile_steps"], batch_size=settings["batch"], verbose=0
    )


def _search_stage(model, train, val, settings, device, profile) -> tuple[SearchResult, str]:
    """Searches a plan; returns it with a line saying where the per-layer costs came from."""
    dtypes = _search_dtypes(device)
    batch = (train[0][: settings["batch"]], train[1][: settings["batch"]])
    if settings["measure"]:
        costs = calibrate(model, batch, dtypes=dtypes, repeats=5, verbose=0)
        stats = costs.stats
        source = (
            f"per-layer costs measured on this device by calibrate ({stats.get('timed', 0)} "
            f"timed now, {stats.get('cached', 0)} from its cache)"
        )
    else:
        costs = predict_costs(model, device, batch_size=settings["batch"], dtypes=dtypes)
        source = f"per-layer costs predicted from the {device.display_name} profile (--quick)"
    result = search(
        model,
        train,
        val,
        budget=BUDGET,
        n_trials=settings["trials"],
        verbose=0,
        settings=SearchSettings(
            batch_size=settings["batch"],
            steps_per_trial=settings["search_steps"],
            dtypes=dtypes,
            profile=profile,
            costs=costs,
            measure_speedup=False,
            confirm_steps=0,
            seed=0,
        ),
    )
    return result, source


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
        model = build_pressure_model()
    ```
    """
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _train_all(plans: dict[str, Any], initial_weights, data, settings) -> dict[str, dict]:
    """Trains a fresh copy of the model under each plan or Keras policy from the same weights."""
    (x, y), (x_val, y_val) = data
    models, results = {}, {}
    for name, plan in plans.items():
        if isinstance(plan, str):
            with keras_global_policy(plan):
                model = build_pressure_model()
            callbacks = [keras.callbacks.TerminateOnNaN()]
        else:
            model = build_pressure_model()
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
        metric = float(evaluation[BUDGET.log_name])
        results[name] = {
            "uniform_float32": plan == "float32"
            or (not isinstance(plan, str) and set(plan.layers.values()) == {"float32"}),
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
    steps = {name: (lambda model=model: _one_step(model, x, y)) for name, model in models.items()}
    return time_interleaved(
        steps, rounds=rounds, warmup=2, slow_factor=10, slow_rounds=min(rounds, 3)
    )


def _one_step(model, x, y) -> None:
    logs = model.train_on_batch(x, y, return_dict=True)
    float(next(iter(logs.values())))


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


# ---------------------------------------------------------------------- figures


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


# ---------------------------------------------------------------------- entry point


def _quiet_tensorflow() -> None:
    """Silences TensorFlow's retracing warnings: every policy is traced on purpose."""
    try:
        import tensorflow as tf
    except ImportError:
        return
    tf.get_logger().setLevel("ERROR")


@contextlib.contextmanager
def _quiet_optuna():
    """Keeps Optuna's line per trial out of the demo's output, restoring its level after."""
    optuna_logger = logging.getLogger("optuna")
    previous = optuna_logger.level
    optuna_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        optuna_logger.setLevel(previous)


def run_demo(
    output: str | os.PathLike = "plan.json",
    quick: bool = False,
    n_trials: int | None = None,
    *,
    predict_for: str | hardware.HardwareProfile | None = "rtx4090",
    figures_path: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Profiles, searches, trains and times the built-in demo model, printing each result.

    Every verdict printed is read from the figures measured in this run (see `verdicts`):
    step times of every policy timed side by side, in one process, in interleaved rounds
    (minimum and median), and each policy's validation metric after the same training
    from the same weights. The host's CPU and 16-bit flags are printed beside them.

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
    _quiet_tensorflow()
    started = time.perf_counter()
    settings = _settings(quick, n_trials)
    device = hardware.detect()
    host = describe_host()
    train = make_pressure_data(settings["train"], seed=0)
    val = make_pressure_data(settings["val"], seed=1)
    model = build_pressure_model()
    initial_weights = model.get_weights()
    _print_header(model, settings, device, host)

    profile_ = _profile_step(model, train, settings)
    result = _search_step(model, (train, val), settings, device, profile_, output)
    plan = result.plan

    trained = _train_all(_candidate_plans(plan), initial_weights, (train, val), settings)
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
        "predicted": _predict(model, plan, predict_for, CARD_BATCH),
        "device": {"name": device.display_name, "kind": device.kind},
        "layer_costs": "measured" if settings["measure"] else "predicted",
        "plan_path": str(output),
        "trials": len(result.study.trials),
    }
    figures = _figures(trained["results"], timings, plan, context)
    _print_results(figures, settings, host, timed_apart)
    figures["wall_seconds"] = time.perf_counter() - started
    _write_figures(figures, figures_path)
    print(f"done in {figures['wall_seconds']:.0f} s")
    return figures


def _print_header(model, settings: Mapping[str, int], device, host: Mapping[str, Any]) -> None:
    """Prints the run's first lines: the model, its data and device, and the host."""
    print(
        f"autoprec demo: {model.name}, {model.count_params():,} parameters, "
        f"{settings['train']} generated sensor traces -> pressure (hPa), on {device.display_name} "
        f"({device.kind})"
    )
    print(f"host: {host_text(host)}")


def _profile_step(model, train, settings: Mapping[str, int]) -> Profile:
    """Step 1 of 3: profiles the model and prints the layers float16 does not fit."""
    profile_ = _profile_stage(model, train, settings)
    unsafe = ", ".join(profile_.float16_unsafe_layers) or "none"
    print(f"[1/3] profiled {settings['profile_steps']} steps; float16 does not fit: {unsafe}")
    return profile_


def _search_step(model, data, settings, device, profile_: Profile, output) -> SearchResult:
    """Step 2 of 3: searches a plan, saves it to `output`, prints it with its costs' source."""
    train, val = data
    with _quiet_optuna():
        result, costs_source = _search_stage(model, train, val, settings, device, profile_)
    plan = result.plan
    plan.save(output)
    print(
        f"[2/3] searched {len(result.study.trials)} trials over "
        f"{'/'.join(_search_dtypes(device))} (budget: {BUDGET.metric} at most "
        f"{BUDGET.max_relative_drop:.0%} above float32's); plan written to {output}"
    )
    print(f"      {costs_source}:")
    print(layer_table(plan, profile_, plan.metadata.get("evidence", {})))
    return result


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


def _write_figures(figures: Mapping[str, Any], figures_path: str | os.PathLike | None) -> None:
    """Writes the figures as strict JSON to `figures_path` and says so; `None` writes none."""
    if figures_path is not None:
        atomic_write_json(figures_path, _json_ready(figures))
        print(f"figures written to {figures_path}")
