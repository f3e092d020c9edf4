"""Benchmark of `autoprec.search` on this machine: trials, wall time and measured step times.

For each model (MobileNetV2, ResNet50 from `keras.applications` with `weights=None` on
64x64 inputs, and a small Transformer), on generated data: runs the search with
`hardware="local"`, then measures the train-step time of float32, each uniform policy,
the plan, and TF's automatic oneDNN bfloat16 graph rewrite (in a subprocess, since it is
a global graph option). Prints a markdown table.

Per model it also prints the plan's cost over the cheapest uniform plan that held the
budget (`plan / best uniform`: measured here for `hardware="local"`, predicted from the
search's cost table for a named profile, which must be at most 1.00), the training
steps the search used after its trivial-baseline check, and the result of the
confirmation at a higher fidelity ("budget held on retraining").

Usage:
    python bench/search.py [--quick] [--models mobilenetv2,resnet50,transformer]
                           [--hardware local,rtx4090] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import autoprec  # noqa: E402
from autoprec import cost  # noqa: E402
from autoprec.errors import AutoprecError  # noqa: E402
from autoprec.search import Budget, SearchSettings, search  # noqa: E402

CLASSES = 10


def build_model(name: str) -> keras.Model:
    """Returns a compiled model by benchmark name."""
    keras.utils.set_random_seed(0)
    if name == "mobilenetv2":
        model = keras.applications.MobileNetV2(
            input_shape=(64, 64, 3), weights=None, classes=CLASSES
        )
    elif name == "resnet50":
        model = keras.applications.ResNet50(input_shape=(64, 64, 3), weights=None, classes=CLASSES)
    elif name == "transformer":
        model = build_transformer()
    else:
        raise SystemExit(f"unknown model {name!r}; use mobilenetv2, resnet50, transformer")
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def build_transformer(sequence: int = 64, width: int = 256, blocks: int = 2) -> keras.Model:
    """A small Transformer encoder classifier on float features."""
    inputs = keras.Input((sequence, 32))
    hidden = keras.layers.Dense(width, name="embed")(inputs)
    for index in range(blocks):
        attended = keras.layers.MultiHeadAttention(
            num_heads=4, key_dim=width // 4, name=f"block_{index}_attention"
        )(hidden, hidden)
        hidden = keras.layers.LayerNormalization(name=f"block_{index}_norm1")(
            keras.layers.Add(name=f"block_{index}_add1")([hidden, attended])
        )
        feed = keras.layers.Dense(4 * width, activation="gelu", name=f"block_{index}_ff1")(hidden)
        feed = keras.layers.Dense(width, name=f"block_{index}_ff2")(feed)
        hidden = keras.layers.LayerNormalization(name=f"block_{index}_norm2")(
            keras.layers.Add(name=f"block_{index}_add2")([hidden, feed])
        )
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(hidden)
    outputs = keras.layers.Dense(CLASSES, activation="softmax", name="head")(pooled)
    return keras.Model(inputs, outputs, name="transformer")


def make_data(model: keras.Model, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Generated inputs with labels from a fixed random projection of their channel means.

    Images and sequences are labelled from their mean over space or time (what a
    globally pooled model can learn in a few dozen steps), flat inputs from themselves.
    """
    rng = np.random.default_rng(0)
    shape = tuple(model.inputs[0].shape[1:])
    x = rng.normal(size=(samples, *shape)).astype("float32")
    features = x.reshape(samples, -1, shape[-1]).mean(axis=1) if len(shape) > 1 else x
    projection = rng.normal(size=(features.shape[1], CLASSES)).astype("float32")
    y = np.argmax(features @ projection, axis=1).astype("int32")
    return x, y


def split_data(model: keras.Model, batch_size: int, train_steps: int):
    """Returns `(train, val)`: enough training batches for 8 x `train_steps` (lengthened
    training sees fresh batches) and 16 validation batches."""
    train_samples, val_samples = batch_size * 8 * train_steps, batch_size * 16
    x, y = make_data(model, train_samples + val_samples)
    return (x[:train_samples], y[:train_samples]), (x[train_samples:], y[train_samples:])


def _compiled_copy(model: keras.Model, plan) -> keras.Model:
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    handle = autoprec.apply_plan(clone, plan)
    optimizer = keras.optimizers.Adam(1e-3)
    if handle.uses_float16:
        optimizer = autoprec.FlooredLossScaleOptimizer(optimizer)
    clone.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return clone


def interleaved_step_seconds(
    model: keras.Model, plans: dict, batch, rounds: int = 7, warmup: int = 2
) -> dict[str, float]:
    """Median train-step seconds of each plan, timed in interleaved rounds (one step each).

    Interleaving puts every plan under the same machine load, so their ratios
    are comparable on a shared, noisy machine.
    """
    copies = {name: _compiled_copy(model, plan) for name, plan in plans.items()}
    x, y = batch
    for copy in copies.values():
        for _ in range(warmup):
            copy.train_on_batch(x, y)
    times: dict[str, list[float]] = {name: [] for name in copies}
    for _ in range(rounds):
        for name, copy in copies.items():
            start = time.perf_counter()
            copy.train_on_batch(x, y)
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(values)) for name, values in times.items()}


def onednn_bf16_seconds(name: str, batch_size: int) -> float | None:
    """Float32 step time with TF's auto_mixed_precision_onednn_bfloat16 rewrite, in a subprocess."""
    folder = os.path.dirname(os.path.abspath(__file__))
    code = "\n".join(
        [
            f"import sys, json; sys.path.insert(0, {folder!r})",
            "import tensorflow as tf",
            "tf.config.optimizer.set_experimental_options("
            "{'auto_mixed_precision_onednn_bfloat16': True})",
            "import search as bench",
            "from autoprec import cost",
            f"m = bench.build_model({name!r}); x, y = bench.make_data(m, {batch_size})",
            "print(json.dumps(cost.measure_train_step(m, (x, y), 'float32')))",
        ]
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=1200
    )
    try:
        return float(json.loads(result.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        print(result.stderr[-2000:], file=sys.stderr)
        return None


def _best_uniform_within_budget(result, timed: dict[str, float] | None) -> tuple[str, float] | None:
    """Returns `(label, seconds)` of the cheapest uniform plan that held the budget.

    Seconds are measured (`timed`, keyed by dtype) when given, else predicted.
    """
    held = {}
    for label, entry in result.plan.metadata["search"]["warm_starts"].items():
        if not entry["within_budget"] or not (label == "float32" or label.startswith("uniform")):
            continue
        dtype = label.split()[-1]
        if timed is not None:
            if dtype in timed:
                held[label] = timed[dtype]
        elif entry["predicted_seconds"] is not None:
            held[label] = entry["predicted_seconds"]
    if not held:
        return None
    label = min(held, key=held.get)
    return label, held[label]


def run_one(name: str, quick: bool, hardware: str = "local", rounds: int = 7) -> dict:
    """Searches one model and measures every policy; returns a row."""
    if hardware != "local":
        return run_predicted(name, quick, hardware)
    model = build_model(name)
    batch_size = 16
    train_steps = 4 if quick else 12
    n_trials = 6 if quick else 16
    train, val = split_data(model, batch_size, train_steps)
    x = train[0]
    y = train[1]
    budget = Budget("val_loss", max_relative_drop=0.02)
    started = time.perf_counter()
    try:
        result = search(
            model,
            train,
            val,
            budget=budget,
            hardware="local",
            n_trials=n_trials,
            verbose=1,
            settings=SearchSettings(
                steps_per_trial=train_steps,
                batch_size=batch_size,
                seed=0,
            ),
        )
    except AutoprecError as error:
        return {"model": name, "hardware": "local", "error": str(error)}
    wall = time.perf_counter() - started
    batch = (x[:batch_size], y[:batch_size])
    row = {
        "model": name,
        "trials": len(result.study.trials),
        "wall_s": wall,
        "plan": result.plan.dtype_counts(),
        "metric": result.plan.metadata["measured_metric"],
        "reference": result.reference_metric,
        "threshold": budget.threshold(result.reference_metric),
    }
    uniform = {
        dtype: autoprec.PrecisionPlan.uniform(model, dtype) for dtype in ("float32", "bfloat16")
    }
    timed = interleaved_step_seconds(model, {"plan": result.plan, **uniform}, batch, rounds=rounds)
    row.update(_search_columns(result))
    best = _best_uniform_within_budget(result, timed)
    row["best_uniform"] = None if best is None else best[0]
    row["plan_over_best_uniform"] = None if best is None else timed["plan"] / best[1]
    row["plan_s"] = timed["plan"]
    row["float32_s"] = timed["float32"]
    row["bfloat16_s"] = timed["bfloat16"]
    # float16 runs on slow fallback kernels on CPU: timed alone, few steps.
    row["float16_s"] = cost.measure_train_step(model, batch, "float16", repeats=2)
    row["plan_equals"] = [
        dtype for dtype, plan in uniform.items() if dict(plan.layers) == dict(result.plan.layers)
    ]
    uniform_ok = {}
    for trial in result.study.trials:
        label = trial.user_attrs.get("warm_start", "")
        if label.startswith("uniform"):
            violation = trial.user_attrs.get("budget_violation")
            uniform_ok[label.split()[-1]] = None if violation is None else violation <= 0
    row["uniform_within_budget"] = uniform_ok
    row["onednn_bf16_s"] = onednn_bf16_seconds(name, batch_size)
    return row


def _search_columns(result) -> dict:
    meta = result.plan.metadata["search"]
    confirmation = meta.get("confirmation") or {}
    return {
        "train_steps": meta["fidelity_check"]["train_steps"],
        "requested_steps": meta["fidelity_check"]["requested_steps"],
        "budget_status": meta["fidelity_check"]["status"],
        "confirmation": confirmation.get("result") if confirmation.get("run") else "not needed",
    }


def run_predicted(name: str, quick: bool, hardware: str) -> dict:
    """Searches one model with costs predicted for a named card; returns a row."""
    model = build_model(name)
    batch_size = 16
    train_steps = 4 if quick else 12
    train, val = split_data(model, batch_size, train_steps)
    budget = Budget("val_loss", max_relative_drop=0.02)
    started = time.perf_counter()
    try:
        result = search(
            model,
            train,
            val,
            budget=budget,
            hardware=hardware,
            n_trials=6 if quick else 16,
            verbose=1,
            settings=SearchSettings(
                steps_per_trial=train_steps,
                batch_size=batch_size,
                cost_batch_size=128,
                seed=0,
            ),
        )
    except AutoprecError as error:
        return {"model": name, "hardware": hardware, "error": str(error)}
    row = {
        "model": name,
        "hardware": hardware,
        "trials": len(result.study.trials),
        "wall_s": time.perf_counter() - started,
        "plan": result.plan.dtype_counts(),
        **_search_columns(result),
    }
    best = _best_uniform_within_budget(result, None)
    chosen = result.plan.metadata.get("predicted_speedup")
    plan_seconds = result.float32_predicted_seconds / chosen if chosen else None
    row["best_uniform"] = None if best is None else best[0]
    row["plan_over_best_uniform"] = (
        None if best is None or plan_seconds is None else plan_seconds / best[1]
    )
    return row


def ratio_table(rows: list[dict]) -> str:
    """Markdown table: plan cost over the best uniform plan within budget, per model and card."""
    lines = [
        "| model | hardware | search wall s | train steps | plan (bf16/f32/f16) "
        "| plan / best uniform within budget | budget held on retraining |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | {row['hardware']} | error: {row['error']} |||||")
            continue
        counts = row["plan"]
        ratio = row.get("plan_over_best_uniform")
        lines.append(
            f"| {row['model']} | {row['hardware']} | {row['wall_s']:.0f} | "
            f"{row['requested_steps']} -> {row['train_steps']} ({row['budget_status']}) | "
            f"{counts['bfloat16']}/{counts['float32']}/{counts['float16']} | "
            + ("n/a" if ratio is None else f"{ratio:.2f} ({row['best_uniform']})")
            + f" | {row['confirmation']} |"
        )
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    """Markdown table of the rows."""
    lines = [
        "| model | trials | search wall s | plan (bf16/f32/f16) | val_loss plan / ref (≤) "
        "| plan ms | f32 ms | bf16 ms | f16 ms | oneDNN auto-bf16 ms | plan is |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "error" in row or row.get("hardware", "local") != "local":
            continue
        counts = row["plan"]

        def ms(key: str, row: dict = row) -> str:
            return "n/a" if row.get(key) is None else f"{row[key] * 1e3:.1f}"

        lines.append(
            f"| {row['model']} | {row['trials']} | {row['wall_s']:.0f} | "
            f"{counts['bfloat16']}/{counts['float32']}/{counts['float16']} | "
            f"{row['metric']:.4f} / {row['reference']:.4f} (≤{row['threshold']:.4f}) | "
            f"{ms('plan_s')} | {ms('float32_s')} | {ms('bfloat16_s')} | {ms('float16_s')} | "
            f"{ms('onednn_bf16_s')} | {', '.join(row.get('plan_equals') or ['mixed'])} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer trials and steps")
    parser.add_argument("--models", default="mobilenetv2,resnet50,transformer")
    parser.add_argument(
        "--hardware", default="local", help="comma-separated: local and/or profile names"
    )
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (>= 5)")
    arguments = parser.parse_args()
    rows = []
    for name in arguments.models.split(","):
        for hardware in arguments.hardware.split(","):
            rows.append(run_one(name.strip(), arguments.quick, hardware.strip(), arguments.rounds))
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    print(ratio_table(rows))


if __name__ == "__main__":
    main()
