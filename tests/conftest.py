"""Shared fixtures: small real Keras models and data, built fresh for each test."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts with a clean Keras session, float32 global policy and fixed seeds."""
    keras.backend.clear_session()
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")


def build_mlp(input_dim: int = 8, classes: int = 3) -> keras.Model:
    """A small Functional classifier: Dense, Dropout, Dense, Dense(softmax)."""
    inputs = keras.Input((input_dim,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    hidden = keras.layers.Dropout(0.1)(hidden)
    hidden = keras.layers.Dense(16, activation="relu")(hidden)
    outputs = keras.layers.Dense(classes, activation="softmax")(hidden)
    return keras.Model(inputs, outputs, name="mlp")


def build_cnn(classes: int = 3) -> keras.Model:
    """A small Sequential CNN on 12x12x1 images."""
    return keras.Sequential(
        [
            keras.Input((12, 12, 1)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(classes, activation="softmax"),
        ],
        name="cnn",
    )


def build_attention_model(sequence: int = 8, features: int = 8, classes: int = 2) -> keras.Model:
    """A Functional model with MultiHeadAttention, LayerNormalization and a softmax head."""
    inputs = keras.Input((sequence, features))
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="attention")(
        inputs, inputs
    )
    hidden = keras.layers.Add()([inputs, attended])
    hidden = keras.layers.LayerNormalization()(hidden)
    hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    outputs = keras.layers.Dense(classes, activation="softmax")(hidden)
    return keras.Model(inputs, outputs, name="attention_model")


def classification_data(
    samples: int = 128, input_dim: int = 8, classes: int = 3, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Linearly separable-ish synthetic classification data."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, input_dim)).astype("float32")
    weights = rng.normal(size=(input_dim, classes)).astype("float32")
    y = np.argmax(x @ weights, axis=1).astype("int32")
    return x, y


@pytest.fixture
def mlp() -> keras.Model:
    return build_mlp()


@pytest.fixture
def cnn() -> keras.Model:
    return build_cnn()


@pytest.fixture
def attention_model() -> keras.Model:
    return build_attention_model()


@pytest.fixture
def classification() -> tuple[np.ndarray, np.ndarray]:
    return classification_data()


def local_with_fast_bfloat16():
    """This device as `detect()` sees it, told that bfloat16 runs fast here.

    The one-liner then profiles and times its candidates on this CPU whatever the
    host runs fast (`hardware.is_local` holds for a detected profile): what it
    measures is real, only the choice of what to measure is forced.
    """
    import dataclasses

    from autoprec.hardware import detect

    device = detect()
    return dataclasses.replace(
        device,
        fast_dtypes=("bfloat16",),
        slow_dtypes=("float16",),
        bfloat16_flops=device.bfloat16_flops or 2 * (device.float32_flops or 1e11),
    )
