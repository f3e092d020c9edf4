"""How well calibrated per-layer costs predict whole training steps, uniform and mixed.

For each model, measures the real whole-model train step (`train_on_batch`) of
the model built under `float32`, `mixed_bfloat16` and `mixed_float16`, and of
two mixed plans (the first half of the layers with weights in bfloat16, or in
float16 with loss scaling, the rest float32), all timed in interleaved rounds
(median), and beside it the step `autoprec.cost.estimate` predicts from a
`calibrate` table twice:

* `pred`: the default calibration: per-layer timings + casts, corrected by the
  whole uniform steps `calibrate` measures for every dtype it times;
* `old`: corrected by the float32 whole step only (a prediction for every
  16-bit policy and plan: nothing 16-bit was timed as a whole).

A uniform policy whose whole step the calibration measured is marked `*`: its
`pred` matches by construction, up to the noise between two measurements of
two copies of the model. The mixed plans are never measured by `calibrate`:
their `pred` is a real prediction, which tests the per-dtype corrections and the
cast costs. float16 steps take many times float32's on a CPU, so steps with
float16 layers are timed `--float16-repeats` times (default 1, after one
warm-up step), or not at all for the models named in `--skip-float16-measure`.

Prints the ratios to float32, their error and whether the predicted ranking of
the three uniform policies is the measured one.

Usage:

```
python bench/cost_accuracy.py              # all models
python bench/cost_accuracy.py --quick      # two small models, fewer repeats
python bench/cost_accuracy.py --models mobilenetv2,transformer --image-size 32
python bench/cost_accuracy.py --skip-float16-measure resnet50,efficientnetb0
```
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from autoprec import PrecisionPlan, apply_plan, cost  # noqa: E402
from autoprec.layers import layer_paths  # noqa: E402

POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
#: Mixed plans measured beside the uniform policies: name -> dtype of the first half.
MIXED = {"half-bf16": "bfloat16", "half-f16": "float16"}
#: Every row of the table: uniform policies, then mixed plans.
ROWS = (*POLICIES, *MIXED)
CLASSES = 10
#: Input height and width of the image models (set by `--image-size`).
IMAGE_SIZE = 32


def build_transformer(sequence: int = 64, vocabulary: int = 1000, width: int = 128) -> keras.Model:
    """A two-block Transformer encoder classifier on token ids."""
    tokens = keras.Input((sequence,), dtype="int32")
    hidden = keras.layers.Embedding(vocabulary, width)(tokens)
    for _ in range(2):
        attended = keras.layers.MultiHeadAttention(num_heads=4, key_dim=width // 4)(hidden, hidden)
        hidden = keras.layers.LayerNormalization()(keras.layers.Add()([hidden, attended]))
        feed = keras.layers.Dense(width * 2, activation="gelu")(hidden)
        feed = keras.layers.Dense(width)(feed)
        hidden = keras.layers.LayerNormalization()(keras.layers.Add()([hidden, feed]))
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    outputs = keras.layers.Dense(CLASSES, activation="softmax", dtype="float32")(pooled)
    return keras.Model(tokens, outputs, name="transformer")


def build_model(name: str) -> keras.Model:
    """Builds a model under the current global dtype policy."""
    shape = (IMAGE_SIZE, IMAGE_SIZE, 3)
    common = {"weights": None, "input_shape": shape, "classes": CLASSES}
    if name == "mobilenetv2":
        return keras.applications.MobileNetV2(**common)
    if name == "resnet50":
        return keras.applications.ResNet50(**common)
    if name == "efficientnetb0":
        return keras.applications.EfficientNetB0(**common)
    if name == "transformer":
        return build_transformer()
    raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


MODELS = ("mobilenetv2", "resnet50", "efficientnetb0", "transformer")


def make_batch(name: str, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    if name == "transformer":
        x = rng.integers(0, 1000, size=(batch_size, 64)).astype("int32")
    else:
        x = rng.standard_normal((batch_size, IMAGE_SIZE, IMAGE_SIZE, 3)).astype("float32")
    y = rng.integers(0, CLASSES, size=(batch_size,)).astype("int32")
    return x, y


def build_compiled(name: str, policy: str) -> keras.Model:
    """Builds and compiles the model under a global dtype policy, then restores float32."""
    keras.config.set_dtype_policy(policy)
    try:
        model = build_model(name)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    finally:
        keras.config.set_dtype_policy("float32")
    return model


def half_plan(model: keras.Model, dtype: str) -> PrecisionPlan:
    """float32, with the first half of the layers that hold weights in `dtype`."""
    weighted = [path for path, layer in layer_paths(model).items() if layer.weights]
    plan = PrecisionPlan.uniform(model, "float32")
    for path in weighted[: len(weighted) // 2]:
        plan = plan.with_dtype(path, dtype)
    return plan


def build_planned(name: str, dtype: str) -> keras.Model:
    """The float32 model with `half_plan` applied, compiled (loss scaling for float16)."""
    keras.config.set_dtype_policy("float32")
    model = build_model(name)
    apply_plan(model, half_plan(model, dtype))
    optimizer = keras.optimizers.Adam()
    if dtype == "float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return model


def _has_float16(row: str) -> bool:
    return "float16" in (row, MIXED.get(row))


def timed_step(model: keras.Model, batch) -> float:
    """Seconds of one `train_on_batch` step."""
    start = time.perf_counter()
    model.train_on_batch(*batch)
    return time.perf_counter() - start


def measure_steps(name: str, batch, repeats: int, float16_repeats: int) -> dict[str, float | None]:
    """Median seconds of real steps per row (policy or mixed plan), timed in interleaved rounds.

    Rows without float16 get two warm-up steps and `repeats` timed ones; rows
    with float16 layers one warm-up step and `float16_repeats` timed ones
    (`None` when 0).
    """
    keras.backend.clear_session()
    counts = {row: float16_repeats if _has_float16(row) else repeats for row in ROWS}
    models = {row: build_compiled(name, policy) for row, policy in POLICIES.items() if counts[row]}
    models.update({row: build_planned(name, dtype) for row, dtype in MIXED.items() if counts[row]})
    for row, model in models.items():
        for _ in range(1 if _has_float16(row) else 2):
            model.train_on_batch(*batch)
    samples: dict[str, list[float]] = {row: [] for row in models}
    for round_index in range(repeats):
        for row, model in models.items():
            if round_index < counts[row]:
                samples[row].append(timed_step(model, batch))
    return {row: statistics.median(samples[row]) if samples.get(row) else None for row in ROWS}


def predict_steps(name: str, batch, repeats: int, cache_dir: str) -> dict:
    """Predicted seconds per step for each uniform policy, with and without per-dtype steps."""
    keras.backend.clear_session()
    model = build_compiled(name, "float32")
    start = time.perf_counter()
    table = cost.calibrate(model, batch, repeats=repeats, cache_dir=cache_dir, verbose=0)
    calibration_seconds = time.perf_counter() - start
    old_table = cost.calibrate(
        model,
        batch,
        repeats=repeats,
        cache_dir=cache_dir,
        verbose=0,
        measure_model_step=["float32"],
    )
    plans = {row: half_plan(model, dtype) for row, dtype in MIXED.items()}

    def steps(costs: cost.CostTable) -> dict[str, float]:
        uniform = {d: cost.estimate(model, d, costs=costs).step_seconds for d in POLICIES}
        return uniform | {
            row: cost.estimate(model, plan, costs=costs).step_seconds for row, plan in plans.items()
        }

    return {
        "predicted": steps(table),
        "old": steps(old_table),
        "whole_steps": sorted(table.measured_step_seconds_by_dtype),
        "calibration_seconds": calibration_seconds,
    }


def ranking(steps: dict) -> str:
    """The uniform policies, fastest first."""
    known = {dtype: steps[dtype] for dtype in POLICIES if steps.get(dtype) is not None}
    return " < ".join(sorted(known, key=known.get))


def ranking_agrees(measured: dict, predicted: dict, tie: float = 0.05) -> bool:
    """Whether every pair of policies the measurement separates by > `tie` is ordered alike."""
    for first in POLICIES:
        for second in POLICIES:
            if measured[first] is None or measured[second] is None:
                continue
            gap = measured[first] / measured[second] - 1
            if gap > tie and predicted[first] <= predicted[second]:
                return False
    return True


def same_ranking(measured: dict, predicted: dict) -> bool:
    """Whether the predicted order of the measured policies is the measured order."""
    known = [dtype for dtype in POLICIES if measured[dtype] is not None]
    return ranking({d: measured[d] for d in known}) == ranking({d: predicted[d] for d in known})


def run(models, batch_size: int, repeats: int, float16_repeats: dict, cache_dir: str) -> list:
    rows = []
    for name in models:
        batch = make_batch(name, batch_size)
        measured = measure_steps(name, batch, repeats, float16_repeats[name])
        rows.append(
            {"model": name, "measured": measured, **predict_steps(name, batch, 3, cache_dir)}
        )
        print_row(rows[-1])
    return rows


def _ratio(steps: dict, dtype: str) -> float | None:
    if steps[dtype] is None or steps["float32"] is None:
        return None
    return steps[dtype] / steps["float32"]


def _cell(value: float | None, pattern: str, width: int) -> str:
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return f"{'-':>{width}}"
    return f"{format(value, pattern):>{width}}"


def _verdict(measured: dict, predicted: dict) -> str:
    exact = "RIGHT" if same_ranking(measured, predicted) else "WRONG"
    tied = "RIGHT" if ranking_agrees(measured, predicted) else "WRONG"
    return f"{exact} (ignoring measured ties within 5%: {tied})"


def print_row(row: dict) -> None:
    measured, predicted, old = row["measured"], row["predicted"], row["old"]
    print(
        f"\n{row['model']} (calibration {row['calibration_seconds']:.0f} s; whole steps "
        f"calibrated: {', '.join(row['whole_steps'])})\n"
        f"  ranking measured {ranking(measured)}; predicted {ranking(predicted)}: "
        f"{_verdict(measured, predicted)}; old {ranking(old)}: {_verdict(measured, old)}",
        flush=True,
    )
    print(
        f"  {'policy':<10} {'meas ms':>9} {'pred ms':>9} {'old ms':>9} {'meas ratio':>11} "
        f"{'pred ratio':>11} {'old ratio':>10} {'pred err':>9} {'old err':>8}"
    )
    for dtype in ROWS:
        measured_ratio = _ratio(measured, dtype)
        predicted_ratio, old_ratio = _ratio(predicted, dtype), _ratio(old, dtype)
        errors = [
            None if measured_ratio is None else ratio / measured_ratio - 1
            for ratio in (predicted_ratio, old_ratio)
        ]
        label = dtype + ("*" if dtype in row["whole_steps"] else "")
        print(
            f"  {label:<10} {_cell(measured[dtype] and measured[dtype] * 1e3, '.1f', 9)} "
            f"{_cell(predicted[dtype] * 1e3, '.1f', 9)} {_cell(old[dtype] * 1e3, '.1f', 9)} "
            f"{_cell(measured_ratio, '.2f', 11)} {_cell(predicted_ratio, '.2f', 11)} "
            f"{_cell(old_ratio, '.2f', 10)} {_cell(errors[0], '+.0%', 9)} "
            f"{_cell(errors[1], '+.0%', 8)}",
            flush=True,
        )


def _within(rows: list, key: str, names: tuple[str, ...], tolerance: float = 0.25) -> str:
    """`"k/n"`: how many measured ratios of `names` the `key` prediction gets within `tolerance`."""
    errors = [
        abs(_ratio(row[key], name) / _ratio(row["measured"], name) - 1)
        for row in rows
        for name in names
        if _ratio(row["measured"], name) is not None
    ]
    return f"{sum(error <= tolerance for error in errors)}/{len(errors)}"


def summarise(rows: list) -> str:
    """Returns the closing lines: rankings right and ratios within 25%, new and old."""
    lines = []
    for key in ("predicted", "old"):
        right = sum(same_ranking(row["measured"], row[key]) for row in rows)
        tied = sum(ranking_agrees(row["measured"], row[key]) for row in rows)
        lines.append(
            f"{key}: ranking right {right}/{len(rows)} ({tied}/{len(rows)} ignoring measured "
            f"ties within 5%), uniform 16-bit ratios within 25% "
            f"{_within(rows, key, ('bfloat16', 'float16'))}, mixed plans within 25% "
            f"{_within(rows, key, tuple(MIXED))}"
        )
    return "\n".join(lines)


def main() -> None:
    global IMAGE_SIZE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small models, fewer repeats")
    parser.add_argument("--models", default=None, help=f"comma-separated subset of {MODELS}")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=IMAGE_SIZE)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--float16-repeats", type=int, default=1, help="timed float16 steps (slow on a CPU)"
    )
    parser.add_argument(
        "--skip-float16-measure",
        default="",
        help="comma-separated models whose real float16 step is not measured ('all': every one)",
    )
    parser.add_argument("--cache-dir", default=None, help="cost cache (default: a temp folder)")
    args = parser.parse_args()
    IMAGE_SIZE = args.image_size
    models = (
        args.models.split(",")
        if args.models
        else (["mobilenetv2", "transformer"] if args.quick else list(MODELS))
    )
    skipped = set(
        models if args.skip_float16_measure == "all" else args.skip_float16_measure.split(",")
    )
    float16_repeats = {name: 0 if name in skipped else args.float16_repeats for name in models}
    repeats = args.repeats or (3 if args.quick else 7)
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="autoprec-bench-")
    print(
        f"keras {keras.__version__}, batch {args.batch_size}, {IMAGE_SIZE}x{IMAGE_SIZE} images, "
        f"repeats {repeats} (float16: {args.float16_repeats}), cache {cache_dir}"
    )
    rows = run(models, args.batch_size, repeats, float16_repeats, cache_dir)
    print("\n" + summarise(rows))


if __name__ == "__main__":
    main()
