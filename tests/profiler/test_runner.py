"""Tests for autoprec.profiler.runner: profile() and ProfileCallback on real models, no mocks."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import build_mlp, classification_data

from autoprec.errors import BackendError, ProfileError
from autoprec.profiler import ProfileCallback, profile


def test_overflow_and_tiny_gradients_are_reported():
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = np.random.default_rng(1).normal(size=(64, 1)).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, kernel_initializer=keras.initializers.Constant(3e4), name="big"),
            keras.layers.Dense(8, name="small"),
            keras.layers.Dense(
                1, kernel_initializer=keras.initializers.Constant(1e-9), name="shrink"
            ),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    prof = profile(model, (x, y), steps=2, batch_size=32)

    big = prof.layers["big"]
    assert big.activation.max_abs > 65504
    assert big.float16_exceeds_max and big.float16_overflow_fraction > 0.1
    assert not big.float16_safe
    assert big.bfloat16_safe

    small = prof.layers["small"]
    gradient = small.activation_gradient
    assert gradient.max_abs < 2.0**-24  # every gradient flushes to zero in float16 ...
    assert gradient.float16_underflow_fraction == pytest.approx(1.0)
    scale = small.suggested_loss_scale
    assert scale >= 2.0**20  # ... until the suggested loss scale lifts them into range
    assert gradient.underflow_fraction("float16", scale) == 0.0
    assert gradient.max_abs * scale <= 65504 / 2
    assert small.loss_scale_covers_range
    assert prof.suggested_loss_scale <= big.suggested_loss_scale
    assert prof.summary().splitlines()[3].startswith("big")  # riskiest first


def _statistic_variable_values() -> dict[str, np.ndarray]:
    gc.collect()
    return {
        f"{id(obj)}": np.array(obj.numpy())
        for obj in gc.get_objects()
        if isinstance(obj, tf.Variable) and "autoprec_" in obj.name
    }


def test_profile_leaves_weights_optimizer_and_graph_unchanged(cnn):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 12, 12, 1)).astype("float32")
    y = rng.integers(0, 3, size=(32,)).astype("int32")
    cnn.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    cnn.fit(x, y, batch_size=16, epochs=1, verbose=0)  # real optimizer state to keep
    weights_before = [w.numpy().copy() for w in cnn.weights]
    optimizer_before = [v.numpy().copy() for v in cnn.optimizer.variables]
    weight_count = len(cnn.weights)

    prof = profile(cnn, tf.data.Dataset.from_tensor_slices((x, y)).batch(8), steps=3)

    assert prof.steps == 3
    assert "batch_normalization" in prof.layers and "flatten" not in prof.layers
    for before, after in zip(weights_before, cnn.weights):
        np.testing.assert_array_equal(before, after.numpy())
    for before, after in zip(optimizer_before, cnn.optimizer.variables):
        np.testing.assert_array_equal(before, after.numpy())
    assert len(cnn.weights) == weight_count
    for layer in cnn.layers:
        assert "call" not in vars(layer)
    assert "train_step" not in vars(cnn) and "apply_gradients" not in vars(cnn.optimizer)

    statistics_before = _statistic_variable_values()
    assert statistics_before
    cnn.fit(x, y, batch_size=16, epochs=1, verbose=0)
    statistics_after = _statistic_variable_values()
    for key, value in statistics_before.items():
        np.testing.assert_array_equal(value, statistics_after[key])


def test_profile_callback_with_jit_compile_stops_recording_after_steps():
    x, y = classification_data(samples=48)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dropout(0.1), keras.layers.Dense(3, activation="softmax")]
    )
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", jit_compile=True)
    callback = ProfileCallback(steps=2)
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])

    assert model.jit_compile is True
    assert callback.profile.steps == 2
    assert len(history.history["loss"]) == 1  # fit ran on past the profile
    dense = callback.profile.layers["dense"]
    assert dense.activations["output"].count == 2 * 8 * 3
    assert dense.weight_gradients["kernel"].count == 2 * 8 * 3
    assert "dropout" not in callback.profile.layers  # pass-through layers are skipped
    assert "call" not in vars(model.layers[-1])


def test_profile_accepts_generators_and_needs_compiled_model():
    x, y = classification_data(samples=48)
    model = build_mlp()
    with pytest.raises(ProfileError, match="compile"):
        profile(model, (x, y))
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")

    def batches():
        for start in range(0, 48, 16):
            yield x[start : start + 16], y[start : start + 16]

    prof = profile(model, batches(), steps=5)
    assert prof.steps == 3  # the generator ran out first
    with pytest.raises(ProfileError, match="unsupported data"):
        profile(model, "not data")


def test_a_backend_without_probes_is_refused(monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    model = build_mlp()
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(BackendError, match="TensorFlow and JAX Keras backends.*'torch'"):
        profile(model, classification_data())


def test_mirrored_strategy_sums_replicas(tmp_path):
    script = textwrap.dedent(
        """
        import os, sys
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        os.environ["KERAS_BACKEND"] = "tensorflow"
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import keras, numpy as np
        sys.path.insert(0, sys.argv[1])
        from conftest import build_mlp, classification_data
        import autoprec.profiler as profiler
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        x, y = classification_data(samples=64)
        with strategy.scope():
            model = build_mlp()
            model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        before = [w.numpy().copy() for w in model.weights]
        prof = profiler.profile(model, (x, y), steps=3, batch_size=16)
        dense = prof.layers["dense"]
        assert prof.steps == 3, prof.steps
        assert dense.activations["output"].count == 3 * 16 * 16, dense.activations
        assert dense.weight_gradients["kernel"].count == 2 * 3 * 8 * 16
        assert all(np.array_equal(b, w.numpy()) for b, w in zip(before, model.weights))
        print("OK")
        """
    )
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # conftest.py
    result = subprocess.run(
        [sys.executable, "-c", script, tests_dir],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


class _OwnLoss(keras.layers.Layer):
    """Adds the mean square of its inputs as the loss: the model trains on inputs alone."""

    def call(self, inputs):
        self.add_loss(keras.ops.mean(keras.ops.square(inputs)))
        return inputs


def test_unbuilt_model_is_built_from_batches_of_inputs_alone():
    x = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
    model = keras.Sequential([keras.layers.Dense(4, name="dense"), _OwnLoss(name="own_loss")])
    model.compile(optimizer="sgd")
    assert not model.built
    prof = profile(model, tf.data.Dataset.from_tensor_slices((x,)).batch(8), steps=2)
    assert prof.steps == 2
    assert prof.layers["dense"].activations["output"].count == 2 * 8 * 4


def test_profile_accepts_an_iterator_that_is_not_a_generator():
    x, y = classification_data(samples=32)
    model = build_mlp()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    batches = iter([(x[:16], y[:16]), (x[16:], y[16:])])
    prof = profile(model, batches, steps=5)
    assert prof.steps == 2  # the iterator ran out first
