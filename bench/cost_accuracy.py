"""How well calibrated per-layer costs predict whole training steps under uniform policies.

For each model, measures the real whole-model train step (`train_on_batch`,
median after warm-up) with the model built under `float32`, `mixed_bfloat16` and
`mixed_float16`, and beside it the step `autoprec.cost.estimate` predicts from a
`calibrate` table (per-layer timings + casts + fixed overhead from one float32
step). Prints the ratios policy/float32, their error and whether the predicted
ranking of the three policies is the measured one.

Usage:

```
python bench/cost_accuracy.py              # all models
python bench/cost_accuracy.py --quick      # two small models, fewer repeats
python bench/cost_accuracy.py --models mobilenetv2,transformer
```
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from autoprec import cost  # noqa: E402

POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
IMAGE_SIZE = 64
CLASSES = 10


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


def measure_step(name: str, policy: str, batch, repeats: int) -> float:
    """Median seconds of a real `train_on_batch` step of the model built under `policy`."""
    keras.backend.clear_session()
    keras.config.set_dtype_policy(policy)
    try:
        model = build_model(name)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        x, y = batch
        for _ in range(2):
            model.train_on_batch(x, y)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            model.train_on_batch(x, y)
            samples.append(time.perf_counter() - start)
        return statistics.median(samples)
    finally:
        keras.config.set_dtype_policy("float32")


def predict_steps(name: str, batch, repeats: int, cache_dir: str) -> tuple[dict, float]:
    """Predicted seconds per step for each uniform policy from one calibration."""
    keras.backend.clear_session()
    keras.config.set_dtype_policy("float32")
    model = build_model(name)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    start = time.perf_counter()
    table = cost.calibrate(model, batch, repeats=repeats, cache_dir=cache_dir, progress=False)
    calibration_seconds = time.perf_counter() - start
    predicted = {dtype: cost.estimate(model, dtype, table).step_seconds for dtype in POLICIES}
    return predicted, calibration_seconds


def ranking(steps: dict) -> str:
    return " < ".join(sorted(steps, key=steps.get))


def ranking_agrees(measured: dict, predicted: dict, tie: float = 0.05) -> bool:
    """Whether every pair of policies the measurement separates by > `tie` is ordered alike."""
    for first in POLICIES:
        for second in POLICIES:
            gap = measured[first] / measured[second] - 1
            if gap > tie and predicted[first] <= predicted[second]:
                return False
    return True


def run(models, batch_size: int, repeats: int, cache_dir: str) -> list[dict]:
    rows = []
    for name in models:
        batch = make_batch(name, batch_size)
        measured = {
            dtype: measure_step(name, policy, batch, repeats) for dtype, policy in POLICIES.items()
        }
        predicted, calibration_seconds = predict_steps(name, batch, max(repeats // 2, 3), cache_dir)
        rows.append(
            {
                "model": name,
                "measured": measured,
                "predicted": predicted,
                "calibration_seconds": calibration_seconds,
            }
        )
        print_row(rows[-1], flush=True)
    return rows


def print_row(row: dict, flush: bool = False) -> None:
    measured, predicted = row["measured"], row["predicted"]
    print(
        f"\n{row['model']} (calibration {row['calibration_seconds']:.0f} s; "
        f"ranking measured {ranking(measured)}, predicted {ranking(predicted)}: "
        f"{'RIGHT' if ranking(measured) == ranking(predicted) else 'WRONG'}; ignoring "
        f"measured ties within 5%: {'RIGHT' if ranking_agrees(measured, predicted) else 'WRONG'})",
        flush=flush,
    )
    print(
        f"  {'policy':<9} {'meas ms':>9} {'pred ms':>9} {'meas ratio':>11} "
        f"{'pred ratio':>11} {'ratio err':>10} {'step err':>9}"
    )
    for dtype in POLICIES:
        measured_ratio = measured[dtype] / measured["float32"]
        predicted_ratio = predicted[dtype] / predicted["float32"]
        ratio_error = predicted_ratio / measured_ratio - 1
        step_error = predicted[dtype] / measured[dtype] - 1
        print(
            f"  {dtype:<9} {measured[dtype] * 1e3:9.1f} {predicted[dtype] * 1e3:9.1f} "
            f"{measured_ratio:11.2f} {predicted_ratio:11.2f} {ratio_error:+10.0%} {step_error:+9.0%}",
            flush=flush,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small models, fewer repeats")
    parser.add_argument("--models", default=None, help=f"comma-separated subset of {MODELS}")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--cache-dir", default=None, help="cost cache (default: a temp folder)")
    args = parser.parse_args()
    models = (
        args.models.split(",")
        if args.models
        else (["mobilenetv2", "transformer"] if args.quick else list(MODELS))
    )
    repeats = args.repeats or (3 if args.quick else 7)
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="autoprec-bench-")
    print(
        f"keras {keras.__version__}, batch {args.batch_size}, {IMAGE_SIZE}x{IMAGE_SIZE} images, "
        f"repeats {repeats}, cache {cache_dir}"
    )
    rows = run(models, args.batch_size, repeats, cache_dir)
    right = sum(ranking(row["measured"]) == ranking(row["predicted"]) for row in rows)
    right_tied = sum(ranking_agrees(row["measured"], row["predicted"]) for row in rows)
    errors = [
        abs(
            (row["predicted"][d] / row["predicted"]["float32"])
            / (row["measured"][d] / row["measured"]["float32"])
            - 1
        )
        for row in rows
        for d in ("bfloat16", "float16")
    ]
    within = sum(error <= 0.25 for error in errors)
    print(
        f"\nranking right for {right}/{len(rows)} models ({right_tied}/{len(rows)} ignoring "
        f"measured ties within 5%); 16-bit ratios within 25%: "
        f"{within}/{len(errors)}"
    )


if __name__ == "__main__":
    main()
