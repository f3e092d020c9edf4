"""`autoprec demo`: profile, search, train and time a built-in model on this device.

The model and its data are generated here (nothing is downloaded). The demo model,
`build_pressure_model`, reads raw sensor traces and predicts an absolute pressure in hPa.
It is built so that the choice of dtype per layer matters, and so that each uniform
16-bit policy loses something:

- `sensor_proj` reads raw, unnormalised counts in (-100000, 100000): they exceed
  float16's largest value (65504), so uniform `mixed_float16` turns them into `inf`
  and the loss into NaN (and TensorFlow runs float16 on slow fallback kernels on a CPU);
- `smooth` is a depthwise convolution over time: little arithmetic per byte, where
  TensorFlow's bfloat16 CPU kernels ran 1.6x to 2.4x slower than float32's on an AMD
  EPYC with AVX512-BF16;
- `wide_1`, `wide_2`, `wide_3` are 1024-wide matmuls, where bfloat16 can pay: about 2x
  per layer on that EPYC and on a GPU with tensor cores, slower on some Xeons (hence
  the measurement);
- `head` predicts about 1013 hPa with a few hPa of signal: bfloat16's 8 significant
  bits space its values 4 hPa apart there, so a bfloat16 head cannot resolve the signal
  and uniform `mixed_bfloat16` misses the loss budget; float32 keeps it.

The verdicts `run_demo` prints come from the figures the same run measured
(`verdicts`): the train steps of every policy timed side by side in interleaved
rounds, their minimum and median, and the loss of each policy trained from the same
weights. Where the plan is not faster than the best uniform policy within budget by
more than the timing noise, it says so.

`build_model` and `make_data` are the smaller demo classifier of the tutorial.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np

from . import hardware
from ._core.io import atomic_write_json
from ._core.timing import Timing, time_interleaved
from .callback import AutoPrecision
from .cost import calibrate, estimate, predict_costs
from .plan import PrecisionPlan
from .profiler import Profile, profile
from .search import Budget, SearchResult, SearchSettings, search

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

#: The policies the demo compares: the searched plan and Keras' three global policies.
POLICIES = ("float32", "plan", "mixed_bfloat16", "mixed_float16")
#: The uniform policies, each built under Keras' own global dtype policy.
UNIFORM_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
#: The compute dtype of each uniform policy, as `autoprec.estimate` takes it.
_UNIFORM_DTYPES = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}
#: Step-time ratios within this fraction of 1 are a tie: the timing noise of a shared CPU.
NOISE = 0.05
#: The demo's budget: the plan's validation MSE may be at most this fraction above float32's.
BUDGET = Budget("val_loss", max_relative_drop=0.5)
#: Batch size of the card prediction: a card this size is launch-bound at the CPU's batch.
CARD_BATCH = 1024
#: The CPU flags that decide 16-bit speed, reported beside the timings.
_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")


# ---------------------------------------------------------------------- model and data


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


def build_pressure_model(seed: int = 0):
    """Returns the compiled demo regressor of `autoprec demo` (Functional, eight compute layers).

    `sensor_proj` (Dense 16 → 64 per time step), `sensor_norm` (LayerNormalization),
    `smooth` (DepthwiseConv1D, kernel 5), `pool` (AveragePooling1D, 4), `flat`,
    `wide_1`..`wide_3` (Dense 1024, ReLU), `narrow` (Dense 32, ReLU) and `head`
    (Dense 1, its bias started at 1013.25 hPa); Adam, mean squared error, MAE.

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

    The data of the tutorial's classifier (`build_model`).

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
    """Returns the compiled demo classifier of the tutorial (Functional, six compute layers).

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


def host_text(host: Mapping[str, Any]) -> str:
    """Returns the host line printed beside the timings, e.g. `"AMD EPYC, 2 cores, avx512_bf16"`.

    Args:
        host: as `describe_host` returns it.

    Returns:
        The CPU model, its cores and the 16-bit flags it has (`"no 16-bit flags"` if none).
    """
    flags = [flag for flag in _CPU_FLAGS if host.get("flags", {}).get(flag)]
    missing = [flag for flag in _CPU_FLAGS if flag not in flags]
    flag_text = ", ".join(flags) if flags else "no 16-bit flags"
    if flags and missing:
        flag_text += f" (no {', '.join(missing)})"
    return f"{host.get('cpu', 'CPU')}, {host.get('cores', '?')} cores, {flag_text}"


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
    """Train-step seconds per model, timed side by side in interleaved rounds.

    The order rotates every round. A policy whose warm-up step is over 10x slower than
    the fastest (float16 on fallback kernels) is timed apart, with at most 3 steps,
    so it neither dominates the run time nor slows the steps timed right after it.
    """
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


# ---------------------------------------------------------------------- verdicts


@dataclasses.dataclass(frozen=True)
class Comparison:
    """How the plan compares with one uniform policy in one run's figures.

    Attributes:
        policy: the uniform policy (`"float32"`, `"mixed_bfloat16"`, `"mixed_float16"`).
        speed: `"faster"` (the plan is faster: see `speed_relation`), `"slower"` (the
            policy is) or `"tie"`.
        median_ratio: the policy's median step over the plan's (> 1: the plan is faster).
        minimum_ratio: the policy's fastest step over the plan's.
        budget: `"within"`, `"missed"` (finite, but over the budget) or `"diverged"`.
        rounds_won: interleaved rounds in which the plan's step was the faster of the two,
            or `None` when the two were not timed in the same rounds.
        rounds: interleaved rounds both were timed in (`None` likewise).
    """

    policy: str
    speed: str
    median_ratio: float
    minimum_ratio: float
    budget: str
    rounds_won: int | None = None
    rounds: int | None = None


#: One-sided significance of the sign test over paired interleaved rounds.
SIGNIFICANCE = 0.05


def rounds_needed(rounds: int, significance: float = SIGNIFICANCE) -> int | None:
    """Returns the fewest rounds out of `rounds` one policy must win to be called faster.

    A sign test: under "no difference" each interleaved round is a coin toss, and `k`
    wins is enough when at least `k` heads in `rounds` tosses has a probability below
    `significance`.

    Args:
        rounds: paired rounds.
        significance: the one-sided probability allowed.

    Returns:
        The wins needed, or `None` when even winning every round is not enough (too few
        rounds: 4 or fewer at 0.05).

    Example:

    ```python
    rounds_needed(20)  # 15
    rounds_needed(3)  # None
    ```
    """
    for wins in range(rounds + 1):
        tail = sum(math.comb(rounds, k) for k in range(wins, rounds + 1)) / 2**rounds
        if tail < significance:
            return wins
    return None


def speed_relation(
    median_ratio: float,
    minimum_ratio: float,
    noise: float = NOISE,
    rounds_won: int | None = None,
    rounds: int | None = None,
) -> str:
    """Returns `"faster"`, `"slower"` or `"tie"`: what the step timings support.

    A ratio is another policy's step time over the plan's. The plan is called faster
    only when both the median and the fastest step say so by more than `noise` and,
    when the two were timed in the same interleaved rounds, the plan won enough of
    them (`rounds_needed`); slower likewise; anything else, including the figures
    disagreeing, is a tie.

    Args:
        median_ratio: the other policy's median step over the plan's.
        minimum_ratio: the other policy's fastest step over the plan's.
        noise: the fraction either side of 1 that is a tie.
        rounds_won: rounds in which the plan's step was faster, or `None` (not paired).
        rounds: paired rounds, or `None`.

    Returns:
        `"faster"`, `"slower"` or `"tie"`.

    Example:

    ```python
    speed_relation(1.30, 1.25)  # "faster"
    speed_relation(1.10, 1.01)  # "tie": the fastest steps do not support it
    speed_relation(1.30, 1.25, rounds_won=12, rounds=20)  # "tie": 12 of 20 is chance
    ```
    """
    if not (math.isfinite(median_ratio) and math.isfinite(minimum_ratio)):
        return "tie"
    needed = rounds_needed(rounds) if rounds else None
    paired = rounds_won is not None and bool(rounds)
    if median_ratio > 1 + noise and minimum_ratio > 1 + noise:
        if not paired or (needed is not None and rounds_won >= needed):
            return "faster"
    if median_ratio < 1 / (1 + noise) and minimum_ratio < 1 / (1 + noise):
        if not paired or (needed is not None and rounds - rounds_won >= needed):
            return "slower"
    return "tie"


def paired_rounds(figures: Mapping[str, Any], name: str) -> tuple[int | None, int | None]:
    """Returns `(rounds the plan won, rounds)` against policy `name`, from the step samples.

    The interleaved timer runs every policy once per round, so sample `i` of each policy
    is from round `i`; a policy timed apart (over 10x slower) is not paired.

    Args:
        figures: a run's figures (`step_samples`, `timing["timed_apart"]`).
        name: a policy of `UNIFORM_POLICIES`.

    Returns:
        `(wins, rounds)`, or `(None, None)` when the two were not timed in the same rounds.
    """
    samples = figures.get("step_samples") or {}
    apart = set((figures.get("timing") or {}).get("timed_apart", ()))
    plan, other = samples.get("plan"), samples.get(name)
    if not plan or not other or len(plan) != len(other) or apart & {"plan", name}:
        return None, None
    return sum(mine < theirs for mine, theirs in zip(plan, other)), len(plan)


def budget_status(figures: Mapping[str, Any], name: str) -> str:
    """Returns `"within"`, `"missed"` or `"diverged"`: policy `name` against the run's budget.

    Args:
        figures: a run's figures (`finite`, `metrics`, `budget["threshold"]`, `mode`).
        name: a policy of `POLICIES`.

    Returns:
        `"diverged"` when its training was not finite, `"missed"` when its validation
        metric is worse than the threshold, else `"within"`.
    """
    value = figures["metrics"].get(name, math.nan)
    if not figures["finite"].get(name, False) or value is None or not math.isfinite(value):
        return "diverged"
    threshold = figures["budget"]["threshold"]
    worse = value < threshold if figures["mode"] == "max" else value > threshold
    return "missed" if worse else "within"


def compare(figures: Mapping[str, Any], noise: float = NOISE) -> dict[str, Comparison]:
    """Returns how the plan compares with each uniform policy, read from a run's figures.

    Args:
        figures: a run's figures: `step_seconds` (medians), `step_seconds_min`,
            `step_samples` and `timing` (for the paired rounds, optional), `finite`,
            `metrics`, `budget`, `mode`.
        noise: the step-time fraction that is a tie.

    Returns:
        `{policy: Comparison}` for each of `UNIFORM_POLICIES`.
    """
    median, minimum = figures["step_seconds"], figures["step_seconds_min"]
    comparisons = {}
    for name in UNIFORM_POLICIES:
        median_ratio = median[name] / median["plan"]
        minimum_ratio = minimum[name] / minimum["plan"]
        won, rounds = paired_rounds(figures, name)
        comparisons[name] = Comparison(
            policy=name,
            speed=speed_relation(median_ratio, minimum_ratio, noise, won, rounds),
            median_ratio=median_ratio,
            minimum_ratio=minimum_ratio,
            budget=budget_status(figures, name),
            rounds_won=won,
            rounds=rounds,
        )
    return comparisons


def verdicts(figures: Mapping[str, Any], noise: float = NOISE) -> list[str]:
    """Returns the sentences `run_demo` prints, each one read from the run's figures.

    One sentence per uniform policy (its speed against the plan's, its metric against
    the budget), one on the plan's own metric, a conclusion against the fastest uniform
    policy within budget, and the prediction for a card when the figures have one. No
    sentence claims a speed difference that the minimum and median steps do not both
    show by more than `noise`, nor one that the paired interleaved rounds do not show
    (`speed_relation`).

    Args:
        figures: as `run_demo` returns them.
        noise: the step-time fraction that is a tie.

    Returns:
        The sentences, in print order.

    Example:

    ```python
    figures = autoprec.demo.run_demo(quick=True)
    assert autoprec.demo.verdicts(figures) == figures["verdicts"]
    ```
    """
    comparisons = compare(figures, noise)
    metric = figures["metric"]
    lines = []
    if figures.get("plan_uniform_float32"):
        costs = figures.get("layer_costs", "measured")
        lines.append(f"the plan is uniform float32: no layer {costs} faster in 16-bit here.")
    for name in UNIFORM_POLICIES:
        lines.append(_policy_sentence(figures, comparisons[name], metric, noise))
    plan_budget = budget_status(figures, "plan")
    if plan_budget == "within":
        lines.append(
            f"plan: {metric} {_number(figures['metrics']['plan'])}, within the budget "
            f"({_budget_text(figures)})."
        )
    else:
        lines.append(
            f"plan: {'training diverged' if plan_budget == 'diverged' else 'misses the budget'}"
            f" in this run ({metric} {_number(figures['metrics']['plan'])}; "
            f"{_budget_text(figures)})."
        )
    lines.append(_conclusion(figures, comparisons, plan_budget, noise))
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
    if comparison.speed == "faster":
        return f"the plan is faster ({ratios})"
    if comparison.speed == "slower":
        return f"it is faster than the plan ({ratios})"
    needed = rounds_needed(comparison.rounds) if comparison.rounds else None
    rule = f"a difference must exceed {noise:.0%} at both the median and the fastest step"
    if comparison.rounds:
        rule += (
            f" and win at least {needed} of {comparison.rounds} rounds"
            if needed is not None
            else f", and {comparison.rounds} rounds cannot show one"
        )
    return f"same speed as the plan within noise ({rule}; {ratios})"


def _conclusion(figures, comparisons: dict[str, Comparison], plan_budget: str, noise) -> str:
    device = figures.get("device") or {}
    if device.get("kind") == "cpu" or (not device and figures.get("host")):
        where = f"on this CPU ({figures['host']['cpu']})"
    else:
        where = f"on this device ({device['name']})" if device else "here"
    eligible = [name for name in UNIFORM_POLICIES if comparisons[name].budget == "within"] or [
        "float32"
    ]
    best = min(eligible, key=lambda name: figures["step_seconds"][name])
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
    if value is None or not math.isfinite(value):
        return "nan"
    return f"{value:.4g}"


def _ratios(step_seconds: Mapping[str, float]) -> dict[str, float]:
    """`{policy: its step over the plan's}` for every policy but the plan."""
    return {name: step_seconds[name] / step_seconds["plan"] for name in POLICIES if name != "plan"}


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


def results_table(figures: Mapping[str, Any]) -> str:
    """Returns the printed table: each policy's metric, budget, loss, steps and prediction.

    Args:
        figures: as `run_demo` returns them.

    Returns:
        The table's text, one row per policy of `POLICIES`.
    """
    predicted = figures.get("predicted")
    headers = ["policy", figures["metric"], "budget", "final loss", "step ms min", "median"]
    headers += ["median vs plan", "plan faster in"]
    if predicted:
        headers.append(f"{predicted['hardware']} pred. ms (batch {predicted['batch_size']})")
    rows = []
    for name in POLICIES:
        status = budget_status(figures, name)
        row = [
            name,
            _number(figures["metrics"][name]) if status != "diverged" else "diverged",
            {"within": "ok", "missed": "MISSED", "diverged": "MISSED"}[status],
            _number(figures["losses"][name]),
            f"{figures['step_seconds_min'][name] * 1e3:.1f}",
            f"{figures['step_seconds'][name] * 1e3:.1f}",
            "-" if name == "plan" else f"{figures['speedup_over'][name]:.2f}x",
            _rounds_text(figures, name),
        ]
        if predicted:
            row.append(f"{predicted['step_seconds'][name] * 1e3:.3f}")
        rows.append(tuple(row))
    return _table(tuple(headers), rows)


def _rounds_text(figures: Mapping[str, Any], name: str) -> str:
    if name == "plan":
        return "-"
    won, rounds = paired_rounds(figures, name)
    return "timed apart" if rounds is None else f"{won}/{rounds} rounds"


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
    print(
        f"autoprec demo: {model.name}, {model.count_params():,} parameters, "
        f"{settings['train']} generated sensor traces -> pressure (hPa), on {device.display_name} "
        f"({device.kind})"
    )
    print(f"host: {host_text(host)}")

    profile_ = _profile_stage(model, train, settings)
    unsafe = ", ".join(profile_.float16_unsafe_layers) or "none"
    print(f"[1/3] profiled {settings['profile_steps']} steps; float16 does not fit: {unsafe}")

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
    print(_layer_table(plan, profile_, plan.metadata.get("evidence", {})))

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
    figures["wall_seconds"] = time.perf_counter() - started
    if figures_path is not None:
        atomic_write_json(figures_path, _json_ready(figures))
        print(f"figures written to {figures_path}")
    print(f"done in {figures['wall_seconds']:.0f} s")
    return figures
