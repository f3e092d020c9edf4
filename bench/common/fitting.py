"""Train steps timed inside `fit`, on `tf.data` input (TensorFlow: `bench/gpu.py` never imports this)."""

from __future__ import annotations

import time
from collections.abc import Iterable

import keras
import numpy as np
import tensorflow as tf


class StepTimer(keras.callbacks.Callback):
    """Wall time of every train step, from `on_train_batch_begin` to its `on_train_batch_end`.

    Synchronised by reading the loss. Placed last in `callbacks`, so what the callbacks
    before it do in a step (the guard's per-step read) counts.
    """

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []
        self.started = 0.0

    def on_train_batch_begin(self, batch, logs=None) -> None:
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None) -> None:
        float(logs["loss"])  # wait for the step
        self.seconds.append(time.perf_counter() - self.started)


def fit_step_seconds(
    model: keras.Model, data: tf.data.Dataset, steps: int, callbacks: Iterable = ()
) -> list[float]:
    """Seconds of each of `steps` train steps of one `fit` epoch (the timer after `callbacks`)."""
    timer = StepTimer()
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[*callbacks, timer])
    return timer.seconds


def dataset_for(model: keras.Model, batch_size: int) -> tf.data.Dataset:
    """An endless in-memory dataset of random batches matching the model's input."""
    rng = np.random.default_rng(0)
    shape = (batch_size * 4, *model.input_shape[1:])
    if model.input.dtype == "int32":
        x = rng.integers(0, 1000, size=shape).astype("int32")
    else:
        x = rng.normal(size=shape).astype("float32")
    y = rng.integers(0, 10, size=(shape[0],)).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).repeat().cache()
