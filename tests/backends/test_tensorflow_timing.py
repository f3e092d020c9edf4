"""Tests for autoprec._backends.tensorflow: the functions cost calibration times."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from autoprec._backends import tensorflow as tensorflow_timing, timing_backend


def test_the_timing_backend_on_tensorflow_is_this_module():
    assert timing_backend("calibrate()") is tensorflow_timing
    assert tensorflow_timing.versions() == {"tensorflow": tf.__version__}


def test_random_tensors_come_from_the_generator_in_the_asked_dtype():
    first = tensorflow_timing.random_tensor((3, 4), "bfloat16", np.random.default_rng(1))
    again = tensorflow_timing.random_tensor((3, 4), "bfloat16", np.random.default_rng(1))
    assert first.dtype == tf.bfloat16 and tuple(first.shape) == (3, 4)
    assert np.array_equal(first.numpy(), again.numpy())
    batch = np.ones((2, 2), "float32")
    assert tensorflow_timing.to_device(batch) is batch


def test_layer_step_runs_a_forward_and_backward_pass_of_a_mixed_layer():
    layer = keras.layers.Dense(4, dtype="mixed_float16")
    inputs = tf.ones((2, 8), tf.float16)
    step = tensorflow_timing.layer_step(layer, [inputs], {}, jit_compile=False)
    assert np.isfinite(step())
    assert layer.built and layer.kernel.dtype == "float32"


def test_empty_and_cast_steps_return_finite_values():
    assert float(tensorflow_timing.empty_step()()) == 2.0
    assert np.isfinite(float(tensorflow_timing.cast_step("float16", 1024)()))
