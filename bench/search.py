"""Benchmark of `autoprec.search` on this machine: trials, wall time and measured step times.

For each model (MobileNetV2, ResNet50 from `keras.applications` with `weights=None` on
64x64 inputs, and a small Transformer), on generated data: runs the search with
`hardware="local"`, then measures the train-step time of float32, each uniform policy,
the plan, and TF's automatic oneDNN bfloat16 graph rewrite (in a subprocess, since it is
a global graph option). Prints a markdown table.

Usage:
    python bench/search.py [--quick] [--models mobilenetv2,resnet50,transformer]
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
from autoprec.search import Budget, search  # noqa: E402

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
    """Generated inputs with labels from a fixed random projection (learnable)."""
    rng = np.random.default_rng(0)
    shape = tuple(model.inputs[0].shape[1:])
    x = rng.normal(size=(samples, *shape)).astype("float32")
    projection = rng.normal(size=(int(np.prod(shape)), CLASSES)).astype("float32")
    y = np.argmax(x.reshape(samples, -1) @ projection, axis=1).astype("int32")
    return x, y


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


def run_one(name: str, quick: bool) -> dict:
    """Searches one model and measures every policy; returns a row."""
    model = build_model(name)
    batch_size = 16
    train_steps = 4 if quick else 12
    n_trials = 6 if quick else 16
    x, y = make_data(model, batch_size * (train_steps + 4))
    split = batch_size * train_steps
    budget = Budget("val_loss", max_relative_drop=0.02)
    started = time.perf_counter()
    result = search(
        model,
        (x[:split], y[:split]),
        (x[split:], y[split:]),
        budget,
        hardware="local",
        n_trials=n_trials,
        train_steps=train_steps,
        batch_size=batch_size,
        seed=0,
        verbose=1,
    )
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
    timed = interleaved_step_seconds(model, {"plan": result.plan, **uniform}, batch)
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


def table(rows: list[dict]) -> str:
    """Markdown table of the rows."""
    lines = [
        "| model | trials | search wall s | plan (bf16/f32/f16) | val_loss plan / ref (≤) "
        "| plan ms | f32 ms | bf16 ms | f16 ms | oneDNN auto-bf16 ms | plan is |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
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
    arguments = parser.parse_args()
    rows = []
    for name in arguments.models.split(","):
        rows.append(run_one(name.strip(), arguments.quick))
        print(json.dumps(rows[-1]), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
