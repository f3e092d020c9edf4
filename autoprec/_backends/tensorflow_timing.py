"""TensorFlow side of cost calibration: compiled forward+backward steps, casts and dispatch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf


def versions() -> dict[str, str]:
    """Framework versions that key the cost cache."""
    return {"tensorflow": tf.__version__}


def to_device(value: Any) -> Any:
    """Returns `value` unchanged: `train_on_batch` converts NumPy batches each step."""
    return value


def random_tensor(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> tf.Tensor:
    """A standard-normal tensor of `shape`, drawn with `rng`, in `dtype`."""
    values = rng.standard_normal(shape).astype("float32")
    return tf.cast(tf.constant(values), dtype)


def layer_step(layer, args: list, kwargs: dict, jit_compile: bool) -> Callable[[], Any]:
    """A compiled forward and backward pass of `layer` on fixed inputs and upstream gradients."""
    outputs = layer(*args, **kwargs)
    float_outputs = [t for t in tf.nest.flatten(outputs) if t.dtype.is_floating]
    upstream = [tf.cast(tf.random.normal(t.shape), t.dtype) for t in float_outputs]
    float_inputs = [
        t for t in tf.nest.flatten((args, kwargs)) if tf.is_tensor(t) and t.dtype.is_floating
    ]
    variables = list(layer.trainable_variables)

    @tf.function(jit_compile=jit_compile, autograph=False)
    def step():
        with tf.GradientTape() as tape:
            tape.watch(float_inputs)
            results = layer(*args, **kwargs)
            flat = [t for t in tf.nest.flatten(results) if t.dtype.is_floating]
        gradients = tape.gradient(flat, float_inputs + variables, output_gradients=upstream)
        touched = [tf.reshape(g, [-1])[:1] for g in gradients if g is not None]
        touched += [tf.reshape(t, [-1])[:1] for t in flat]
        return tf.add_n([tf.cast(tf.reduce_sum(t), tf.float32) for t in touched])

    return lambda: step().numpy()


def empty_step() -> Callable[[], Any]:
    """The cheapest compiled call: what one dispatch costs."""
    value = tf.constant([1.0])

    @tf.function(autograph=False)
    def step():
        return tf.reduce_sum(value + 1.0)

    return lambda: step().numpy()


def cast_step(dtype: str, elements: int) -> Callable[[], Any]:
    """A compiled float32 -> `dtype` -> float32 round trip over `elements` values."""
    source = tf.random.normal([elements])
    target_dtype = tf.as_dtype(dtype)

    @tf.function(autograph=False)
    def step():
        there = tf.cast(source, target_dtype)
        back = tf.cast(there, tf.float32)
        return back[0]

    return lambda: step().numpy()
