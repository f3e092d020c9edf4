"""The largest training batch that fits an 8 GB RTX 4060 Ti: float32 against a 16-bit plan.

Memory is estimated from the model's activations, weights and optimizer state
(`autoprec.estimate(...).max_batch_size()`); no GPU is needed.

Run: python examples/fit_bigger_batch.py [--smoke]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

import autoprec  # noqa: E402


def build_model(size: int) -> keras.Model:
    """A small CNN on `size` x `size` RGB images with a float32 softmax head."""
    inputs = keras.Input((size, size, 3))
    hidden = inputs
    for filters in (64, 128, 256):
        hidden = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(hidden)
        hidden = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(hidden)
        hidden = keras.layers.MaxPooling2D()(hidden)
    hidden = keras.layers.GlobalAveragePooling2D()(hidden)
    outputs = keras.layers.Dense(100, activation="softmax", name="head")(hidden)
    model = keras.Model(inputs, outputs, name="cnn")
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="small images for tests")
    args = parser.parse_args(argv)
    model = build_model(64 if args.smoke else 224)
    hardware = "rtx4060ti-8gb"
    plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")

    rows = []
    for label, chosen in (("float32", "float32"), ("float16 plan", plan)):
        figures = autoprec.estimate(model, chosen, hardware, batch_size=32)
        rows.append((label, figures.max_batch_size(), figures.step_seconds * 1e3))
    print(f"largest batch on {hardware} (8 GB):")
    for label, batch, milliseconds in rows:
        print(f"  {label:<13} batch {batch:>5}   predicted step at batch 32: {milliseconds:.1f} ms")
    print(f"the plan fits {rows[1][1] / max(rows[0][1], 1):.2f}x the batch of float32")


if __name__ == "__main__":
    main()
