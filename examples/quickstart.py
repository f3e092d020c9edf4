"""Quickstart: one extra line gives a small CNN a per-layer precision plan.

Run: python examples/quickstart.py [--smoke]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import autoprec  # noqa: E402


def make_data(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Generated 16x16 images: the class is the quadrant holding the brightest blob."""
    rng = np.random.default_rng(seed)
    images = rng.normal(0.0, 0.3, size=(samples, 16, 16, 1)).astype("float32")
    labels = rng.integers(0, 4, size=samples)
    for image, label in zip(images, labels):
        row, column = divmod(int(label), 2)
        image[row * 8 + 2 : row * 8 + 6, column * 8 + 2 : column * 8 + 6, 0] += 2.0
    return images, labels.astype("int32")


def build_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((16, 16, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(4, activation="softmax", name="head"),
        ],
        name="quickstart_cnn",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny run for tests")
    args = parser.parse_args(argv)
    samples, epochs = (128, 1) if args.smoke else (2048, 3)

    x, y = make_data(samples)
    model = build_model()
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])

    # The one extra line: profile the first steps, measure layer costs on this
    # device at fit's batch size, choose each layer's dtype, apply it and train on.
    precision = autoprec.AutoPrecision(
        auto=autoprec.AutoPlan(profile_steps=5), plan_path="quickstart_plan.json"
    )
    history = model.fit(
        x,
        y,
        epochs=epochs,
        batch_size=64,
        validation_split=0.2,
        verbose=2,
        callbacks=[precision],
    )
    print(precision.plan.summary())
    print("final val_accuracy:", round(history.history["val_accuracy"][-1], 3))
    if "loss_scale" in history.history:
        print("loss scale:", history.history["loss_scale"][-1])
    print("plan saved to quickstart_plan.json")


if __name__ == "__main__":
    main()
