"""The demo's models and their data: generated here, nothing is downloaded."""

from __future__ import annotations

import math

import keras
import numpy as np

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


def build_pressure_model(seed: int = 0) -> keras.Model:
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

    Example:

    ```python
    x, y = autoprec.demo.make_data(1024)
    x.shape, y.shape  # (1024, 256), (1024,)
    ```
    """
    teacher = np.random.default_rng(1234).normal(size=(_FEATURES, _CLASSES))
    rng = np.random.default_rng(seed)
    normalised = rng.uniform(-1.0, 1.0, size=(samples, _FEATURES))
    labels = np.argmax(normalised @ teacher, axis=1).astype("int32")
    readings = (normalised * _SENSOR_SCALE).astype("float32")
    return readings, labels


def build_model(seed: int = 0) -> keras.Model:
    """Returns the compiled demo classifier of the tutorial (Functional, six compute layers).

    Args:
        seed: weight initialisation seed.

    Returns:
        A compiled `keras.Model` with an accuracy metric.

    Example:

    ```python
    model = autoprec.demo.build_model()
    model.fit(*autoprec.demo.make_data(1024), epochs=1, verbose=0)
    ```
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
