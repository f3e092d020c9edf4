"""Models and data of the automatic-mode tests: sequences of unknown length, a small classifier."""

from __future__ import annotations

import keras
import numpy as np


def sequence_model() -> keras.Model:
    """A model whose inputs `{"tokens", "features"}` have a `None` sequence dimension."""
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    features = keras.Input((None, 4), name="features")
    embedded = keras.layers.Embedding(50, 4, name="embedding")(tokens)
    summed = keras.layers.Add(name="add")([embedded, features])
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(summed)
    model = keras.Model({"tokens": tokens, "features": features}, keras.layers.Dense(2)(pooled))
    model.compile(optimizer="adam", loss="mse")
    return model


def sequences(samples: int, length: int) -> dict[str, np.ndarray]:
    """Random inputs of `sequence_model`: `samples` sequences of `length` steps."""
    rng = np.random.default_rng(length)
    return {
        "tokens": rng.integers(0, 50, (samples, length)).astype("int32"),
        "features": rng.normal(size=(samples, length, 4)).astype("float32"),
    }


def padded_dataset(lengths: list[int]):
    """A `tf.data` dataset of 8-sample batches padded to each batch's length: unknown when traced."""
    import tensorflow as tf

    def samples():
        for length in lengths:
            for _ in range(8):
                x = {
                    "tokens": np.ones((length,), "int32"),
                    "features": np.ones((length, 4), "float32"),
                }
                yield x, np.zeros((2,), "float32")

    signature = (
        {
            "tokens": tf.TensorSpec((None,), tf.int32),
            "features": tf.TensorSpec((None, 4), tf.float32),
        },
        tf.TensorSpec((2,), tf.float32),
    )
    return tf.data.Dataset.from_generator(samples, output_signature=signature).padded_batch(8)


def mlp(loss: str = "sparse_categorical_crossentropy") -> keras.Model:
    """A compiled four-layer classifier of 64 features (or regressor, by `loss`)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(256, activation="relu", name="hidden"),
            keras.layers.LayerNormalization(name="norm"),
            keras.layers.Dense(256, activation="relu", name="hidden_2"),
            keras.layers.Dense(4, name="head"),
        ]
    )
    model.compile("adam", loss)
    return model


def mlp_data(samples: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Random features and labels for `mlp`."""
    rng = np.random.default_rng(0)
    return rng.standard_normal((samples, 64)).astype("float32"), rng.integers(0, 4, samples)
