"""A small Transformer classifier where uniform float16 overflows and the autoprec plan does not.

Token embeddings are large (scale 60), so the attention logits q·k reach ~1e5, above
float16's largest value 65504: under uniform `mixed_float16` the loss is NaN and every
step is skipped. The plan keeps attention in bfloat16 (float32's range) and trains.

Run: python examples/transformer_text.py [--smoke]
"""

from __future__ import annotations

import argparse
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import autoprec  # noqa: E402

VOCAB, LENGTH = 64, 16


def make_data(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Generated token sequences; the label says whether token 7 appears more than token 3."""
    tokens = np.random.default_rng(seed).integers(0, VOCAB, size=(samples, LENGTH))
    labels = ((tokens == 7).sum(axis=1) > (tokens == 3).sum(axis=1)).astype("int32")
    return tokens.astype("int32"), labels


def build_model() -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((LENGTH,), dtype="int32")
    embedded = keras.layers.Embedding(
        VOCAB, 64, embeddings_initializer=keras.initializers.RandomNormal(stddev=60.0)
    )(inputs)
    attended = keras.layers.MultiHeadAttention(2, 32, name="attention")(embedded, embedded)
    hidden = keras.layers.LayerNormalization()(attended)
    hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    hidden = keras.layers.Dense(64, activation="relu")(hidden)
    outputs = keras.layers.Dense(2, activation="softmax", name="head")(hidden)
    model = keras.Model(inputs, outputs, name="tiny_transformer")
    model.compile(
        keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


def train(plan_for, data, epochs: int) -> tuple[float, float]:
    """Trains a fresh model under `plan_for(model)`; returns (final loss, val accuracy)."""
    (x, y), (x_val, y_val) = data
    model = build_model()
    plan = plan_for(model)
    history = model.fit(
        x,
        y,
        epochs=epochs,
        batch_size=64,
        verbose=0,
        callbacks=[autoprec.AutoPrecision(plan, verbose=0)],
    )
    loss = history.history["loss"][-1]
    accuracy = model.evaluate(x_val, y_val, verbose=0, return_dict=True)["accuracy"]
    return loss, accuracy if math.isfinite(loss) else math.nan


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny run for tests")
    args = parser.parse_args(argv)
    samples, epochs = (512, 1) if args.smoke else (4096, 6)
    data = (make_data(samples), make_data(samples // 4, seed=1))

    def uniform_float16(model):
        return autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")

    def autoprec_plan(model):
        # What the profile shows (attention logits above 65504): attention in bfloat16.
        return uniform_float16(model).with_dtype("attention*", "bfloat16")

    for label, plan_for in (("mixed_float16", uniform_float16), ("autoprec plan", autoprec_plan)):
        loss, accuracy = train(plan_for, data, epochs)
        print(f"{label:<14} final loss {loss:.4g}   val_accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
