"""`autoprec demo`: profile, search, train and time a built-in model (generated, with its data)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import keras
import numpy as np

from .. import hardware
from .._core.dtypes import canonical_dtype
from .._core.io import atomic_write_json
from .._core.timing import SIGNIFICANCE, Timing, judge_rounds, rounds_needed, time_interleaved
from ..callback import AutoPrecision
from ..cost import calibrate, estimate, predict_costs
from ..plan import PrecisionPlan
from ..profiler import Profile, profile
from ..profiler.views import text_table
from ..search import Budget, SearchResult, SearchSettings, search

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
    """Returns generated raw sensor traces and the absolute pressure they read, in hPa."""
    read_out = np.random.default_rng(1234).normal(size=(_CHANNELS,))
    read_out /= np.linalg.norm(read_out)
    rng = np.random.default_rng(seed)
    normalised = rng.uniform(-1.0, 1.0, size=(samples, _STEPS, _CHANNELS))
    signal = (normalised.mean(axis=1) @ read_out) * math.sqrt(3 * _STEPS)
    pressure = _PRESSURE_HPA + _SIGNAL_HPA * signal
    counts = (normalised * _COUNTS_SCALE).astype("float32")
    return counts, pressure.astype("float32")[:, None]


def build_pressure_model(seed: int = 0) -> keras.Model:
    """Returns the compiled demo regressor of `autoprec demo` (Functional, eight compute layers)."""
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
    """Returns generated raw sensor readings and class labels from a fixed random teacher."""
    teacher = np.random.default_rng(1234).normal(size=(_FEATURES, _CLASSES))
    rng = np.random.default_rng(seed)
    normalised = rng.uniform(-1.0, 1.0, size=(samples, _FEATURES))
    labels = np.argmax(normalised @ teacher, axis=1).astype("int32")
    readings = (normalised * _SENSOR_SCALE).astype("float32")
    return readings, labels


def build_model(seed: int = 0) -> keras.Model:
    """Returns the compiled demo classifier of the tutorial (Functional, six compute layers)."""
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


#: The demo's budget: the plan's validation MSE may be at most this fraction above float32's.
BUDGET = Budget("val_loss", max_relative_drop=0.5)
#: Batch size of the card prediction: a card this size is launch-bound at the CPU's batch.
CARD_BATCH = 1024


def _settings(quick: bool, trials: int | None) -> dict[str, int]:
    settings = {"train": 4096, "val": 1024, "batch": 128, "epochs": 3, "trials": 6, "rounds": 20}
    settings.update({"search_steps": 32, "profile_steps": 2, "measure": 1})
    if quick:
        settings.update(train=1024, val=256, batch=32, epochs=1, trials=1, rounds=3)
        settings.update(profile_steps=1, measure=0)
    if trials is not None:
        settings["trials"] = max(1, int(trials))
    return settings


def _search_dtypes(device) -> list[str]:
    """float32 and bfloat16 on a CPU (TensorFlow runs float16 on fallback kernels there)."""
    if device.kind == "cpu":
        return ["float32", "bfloat16"]
    return ["float32", *[dtype for dtype in ("bfloat16", "float16") if device.is_fast(dtype)]]


def describe_host() -> dict[str, Any]:
    """Returns what decides 16-bit speed on this machine: CPU model, cores, 16-bit flags."""
    return {
        "cpu": hardware.detect_cpu().display_name,
        "cores": os.cpu_count() or 1,
        "flags": dict(hardware.cpu_flags()),
    }


@contextlib.contextmanager
def keras_global_policy(name: str):
    """Builds models under Keras' global dtype policy `name`, restoring the previous one after."""
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


def _train_all(plan: PrecisionPlan, initial_weights, data, settings) -> tuple[dict, dict]:
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
    return models, results


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
        planned = plan if name == "plan" else canonical_dtype(name)
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
    """Profiles, searches, trains and times the built-in demo model, printing each result."""
    with contextlib.suppress(ImportError):  # every policy is traced on purpose: no retrace warning
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")
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
    models, results = _train_all(result.plan, initial_weights, (train, val), settings)
    batch = (train[0][: settings["batch"]], train[1][: settings["batch"]])
    timings = _time_steps(models, initial_weights, batch, settings["rounds"])
    timed_apart = [name for name in POLICIES if len(timings[name].samples) < settings["rounds"]]
    timing = {"batch_size": settings["batch"], "rounds": settings["rounds"]}
    context = {
        "timing": {**timing, "timed_apart": timed_apart},
        "host": host,
        "predicted": _predict(model, result.plan, predict_for, CARD_BATCH),
        "device": {"name": device.display_name, "kind": device.kind},
        "layer_costs": "measured" if settings["measure"] else "predicted",
        "plan_path": str(output),
        "trials": len(result.study.trials),
    }
    figures = _figures(results, timings, result.plan, context)
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


# ---------------------------------------------------------------------- the report

#: The policies the demo compares: the searched plan and Keras' three global policies.
POLICIES = ("float32", "plan", "mixed_bfloat16", "mixed_float16")
#: The uniform policies, each built under Keras' own global dtype policy.
UNIFORM_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
#: A difference under this fraction of the faster step is a tie: the timing noise of a shared CPU.
NOISE = 0.05
#: The dtypes whose measured layer milliseconds the plan's table shows.
_MS_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """How the plan compares with one uniform policy in one run's figures."""

    policy: str
    speed: str
    median_ratio: float
    minimum_ratio: float
    budget: str
    rounds_won: int | None = None
    rounds: int | None = None


def _judged(plan: Sequence[float], other: Sequence[float], noise: float, paired: bool):
    """`judge_rounds` on the plan's and another policy's rounds: `(speed, rounds the plan won)`."""
    verdict = judge_rounds(
        {"plan": plan, "other": other}, ("plan", "other").index, noise_floor=noise,
        significance=SIGNIFICANCE if paired else None,
    )  # fmt: skip
    plan_fastest = verdict.fastest == "plan"
    margin = verdict.comparisons["other" if plan_fastest else "plan"]
    speed = "tie" if not verdict.decided else "faster" if plan_fastest else "slower"
    return speed, margin.won if plan_fastest else margin.rounds - margin.won


def budget_status(figures: Mapping[str, Any], name: str) -> str:
    """Returns `"within"`, `"missed"` or `"diverged"`: policy `name` against the run's budget."""
    value = figures["metrics"].get(name, math.nan)
    if not figures["finite"].get(name, False) or value is None or not math.isfinite(value):
        return "diverged"
    threshold = figures["budget"]["threshold"]
    worse = value < threshold if figures["mode"] == "max" else value > threshold
    return "missed" if worse else "within"


def compare(figures: Mapping[str, Any], noise: float = NOISE) -> dict[str, Comparison]:
    """Returns how the plan compares with each uniform policy, its timed rounds judged."""
    median, minimum = figures["step_seconds"], figures["step_seconds_min"]
    samples, apart = figures["step_samples"], set(figures["timing"]["timed_apart"])
    comparisons = {}
    for name in UNIFORM_POLICIES:
        paired = not apart & {"plan", name}
        speed, won = _judged(samples["plan"], samples[name], noise, paired)
        comparisons[name] = Comparison(
            policy=name,
            speed=speed,
            median_ratio=median[name] / median["plan"],
            minimum_ratio=minimum[name] / minimum["plan"],
            budget=budget_status(figures, name),
            rounds_won=won if paired else None,
            rounds=len(samples["plan"]) if paired else None,
        )
    return comparisons


def verdicts(figures: Mapping[str, Any], noise: float = NOISE) -> list[str]:
    """Returns the sentences `run_demo` prints, each one read from the run's figures."""
    comparisons = compare(figures, noise)
    metric = figures["metric"]
    lines = []
    if figures.get("plan_uniform_float32"):
        costs = figures.get("layer_costs", "measured")
        lines.append(f"the plan is uniform float32: no layer {costs} faster in 16-bit here.")
    for name in UNIFORM_POLICIES:
        lines.append(_policy_sentence(figures, comparisons[name], metric, noise))
    plan_budget, plan_metric = budget_status(figures, "plan"), _number(figures["metrics"]["plan"])
    if plan_budget == "within":
        lines.append(f"plan: {metric} {plan_metric}, within the budget ({_budget_text(figures)}).")
    else:
        failed = "training diverged" if plan_budget == "diverged" else "misses the budget"
        lines.append(
            f"plan: {failed} in this run ({metric} {plan_metric}; {_budget_text(figures)})."
        )
    lines.append(_conclusion(figures, comparisons, plan_budget))
    if figures.get("predicted"):
        lines.append(_prediction_sentence(figures, comparisons, noise))
    return lines


def _policy_sentence(figures, comparison: Comparison, metric: str, noise: float) -> str:
    name = comparison.policy
    value = figures["metrics"].get(name, math.nan)
    if comparison.budget == "diverged":
        quality = "training diverged (NaN loss)"
    elif comparison.budget == "missed":
        quality = (
            f"misses the budget ({metric} {_number(value)}, allowed "
            f"{_comparator(figures)} {_number(figures['budget']['threshold'])})"
        )
    else:
        quality = f"within the budget ({metric} {_number(value)})"
    return f"{name}: {quality}; {_speed_text(comparison, noise)}."


def _speed_text(comparison: Comparison, noise: float) -> str:
    ratios = (
        f"the plan's speedup over it: {comparison.median_ratio:.2f}x median step, "
        f"{comparison.minimum_ratio:.2f}x fastest step"
    )
    if comparison.rounds:
        ratios += f", the plan faster in {comparison.rounds_won} of {comparison.rounds} rounds"
    claims = {"faster": "the plan is faster", "slower": "it is faster than the plan"}
    if comparison.speed in claims:
        return f"{claims[comparison.speed]} ({ratios})"
    rule = f"a difference must exceed the rounds' noise and {noise:.0%} of the faster step"
    if comparison.rounds:
        needed = rounds_needed(comparison.rounds)
        rule += (
            f" and win at least {needed} of {comparison.rounds} rounds"
            if needed is not None
            else f", and {comparison.rounds} rounds cannot show one"
        )
    return f"same speed as the plan within noise ({rule}; {ratios})"


def _conclusion(figures, comparisons: dict[str, Comparison], plan_budget: str) -> str:
    device = figures.get("device") or {}
    if device.get("kind") == "cpu" or (not device and figures.get("host")):
        where = f"on this CPU ({figures['host']['cpu']})"
    else:
        where = f"on this device ({device['name']})" if device else "here"
    within = [name for name in UNIFORM_POLICIES if comparisons[name].budget == "within"]
    best = min(within or ["float32"], key=lambda name: figures["step_seconds"][name])
    comparison = comparisons[best]
    if plan_budget != "within":
        return (
            f"verdict {where}: use {best}, the fastest uniform policy within budget; the plan "
            "did not keep the budget in this run (search with more steps per trial)."
        )
    if comparison.speed == "faster":
        return (
            f"verdict {where}: the plan is {comparison.median_ratio:.2f}x faster than {best} "
            f"at the median step ({comparison.minimum_ratio:.2f}x at the fastest), {best} "
            "being the fastest uniform policy within budget."
        )
    if comparison.speed == "slower":
        return (
            f"verdict {where}: {best} is {1 / comparison.median_ratio:.2f}x faster than the "
            f"plan at the median step ({1 / comparison.minimum_ratio:.2f}x at the fastest); "
            f"use {best} here."
        )
    return (
        f"verdict {where}: the plan ties {best}, the fastest uniform policy within budget "
        f"(speedup {comparison.median_ratio:.2f}x median step, {comparison.minimum_ratio:.2f}x "
        "fastest step: not a difference beyond the noise); the per-layer choice did not pay "
        "in this run."
    )


def _prediction_sentence(figures, comparisons: dict[str, Comparison], noise: float) -> str:
    predicted = figures["predicted"]
    speedups = predicted["speedup_over"]
    faster_but_broken = [
        name
        for name in ("mixed_bfloat16", "mixed_float16")
        if speedups[name] < 1 / (1 + noise) and comparisons[name].budget != "within"
    ]
    text = (
        f"predicted for {predicted['device']} at batch {predicted['batch_size']} (roofline of "
        f"its built-in profile, not measured): the plan {speedups['float32']:.2f}x float32's "
        f"speed, mixed_bfloat16 {speedups['float32'] / speedups['mixed_bfloat16']:.2f}x, "
        f"mixed_float16 {speedups['float32'] / speedups['mixed_float16']:.2f}x"
    )
    if faster_but_broken:
        text += (
            f"; {' and '.join(faster_but_broken)} predicted faster than the plan there, but "
            f"{'they' if len(faster_but_broken) > 1 else 'it'} failed the budget in this run"
        )
    return text + "."


def _budget_text(figures) -> str:
    budget = figures["budget"]
    return (
        f"{figures['metric']} {_comparator(figures)} {_number(budget['threshold'])} allowed, "
        f"float32 {_number(figures['float32_metric'])}"
    )


def _comparator(figures) -> str:
    return ">=" if figures["mode"] == "max" else "<="


def _number(value: float | None) -> str:
    return "nan" if value is None or not math.isfinite(value) else f"{value:.4g}"


def layer_table(
    plan: PrecisionPlan, profile: Profile | None, costs_evidence: Mapping[str, Any]
) -> str:
    """Returns the printed table of the plan: each layer's range, float16 fit, costs and dtype."""
    headers = ("layer", "class", "max |x|", "f16 fits", "f32 ms", "bf16 ms", "chosen")
    rows = []
    for path, dtype in plan.layers.items():
        info = plan.layer_info.get(path)
        layer_profile = profile.layers.get(path) if profile is not None else None
        seconds = costs_evidence.get(path, {}).get("seconds", {})
        activation = layer_profile.activation if layer_profile is not None else None
        fits = "-" if layer_profile is None else "yes" if layer_profile.float16_safe else "NO"
        milliseconds = [
            "-" if seconds.get(key) is None else f"{seconds[key] * 1e3:.2f}" for key in _MS_DTYPES
        ]
        largest = f"{activation.max_abs:.3g}" if activation is not None else "-"
        rows.append((path, info.class_name if info else "?", largest, fits, *milliseconds, dtype))
    return text_table(headers, rows)


def results_table(figures: Mapping[str, Any]) -> str:
    """Returns the printed table: each policy's metric, budget, loss, steps and prediction."""
    predicted = figures.get("predicted")
    headers = ["policy", figures["metric"], "budget", "final loss", "step ms min", "median"]
    headers += ["median vs plan", "plan faster in"]
    if predicted:
        headers.append(f"{predicted['hardware']} pred. ms (batch {predicted['batch_size']})")
    rows, comparisons = [], compare(figures)
    for name in POLICIES:
        status, against = budget_status(figures, name), ["-", "-"]
        if name != "plan":
            won, rounds = comparisons[name].rounds_won, comparisons[name].rounds
            paired = "timed apart" if rounds is None else f"{won}/{rounds} rounds"
            against = [f"{figures['speedup_over'][name]:.2f}x", paired]
        row = [
            name,
            _number(figures["metrics"][name]) if status != "diverged" else "diverged",
            {"within": "ok", "missed": "MISSED", "diverged": "MISSED"}[status],
            _number(figures["losses"][name]),
            f"{figures['step_seconds_min'][name] * 1e3:.1f}",
            f"{figures['step_seconds'][name] * 1e3:.1f}",
            *against,
        ]
        if predicted:
            row.append(f"{predicted['step_seconds'][name] * 1e3:.3f}")
        rows.append(tuple(row))
    return text_table(tuple(headers), rows)


def host_text(host: Mapping[str, Any]) -> str:
    """Returns the host line printed beside the timings, e.g. `"AMD EPYC, 2 cores, avx512_bf16"`."""
    flags = [flag for flag in hardware.CPU_16BIT_FLAGS if host.get("flags", {}).get(flag)]
    missing = [flag for flag in hardware.CPU_16BIT_FLAGS if flag not in flags]
    flag_text = ", ".join(flags) if flags else "no 16-bit flags"
    if flags and missing:
        flag_text += f" (no {', '.join(missing)})"
    return f"{host.get('cpu', 'CPU')}, {host.get('cores', '?')} cores, {flag_text}"
