"""Missing 16-bit kernels fall back before the first step (autoprec/runtime/kernels.py)."""

from __future__ import annotations

import keras
import numpy as np

from autoprec import AutoPrecision, PrecisionPlan
from autoprec.layers import layer_paths
from autoprec.runtime.kernels import find_missing_kernels


class LogGamma(keras.layers.Layer):
    """lgamma has a float16 but no bfloat16 kernel on TensorFlow's CPU."""

    def call(self, inputs):
        return keras.ops.cast(
            __import__("tensorflow").math.lgamma(inputs + keras.ops.cast(2.0, inputs.dtype)),
            inputs.dtype,
        )


class Determinant(keras.layers.Layer):
    """det has neither a float16 nor a bfloat16 kernel on TensorFlow's CPU."""

    def call(self, inputs):
        matrices = keras.ops.reshape(inputs, (-1, 2, 2))
        eye = keras.ops.eye(2, dtype=inputs.dtype)
        return keras.ops.reshape(__import__("tensorflow").linalg.det(matrices + eye), (-1, 1))


def _kernel_model():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(4, name="dense")(inputs)
    gamma = LogGamma(name="lgamma")(keras.layers.Activation("sigmoid")(hidden))
    determinant = Determinant(name="det")(gamma)
    outputs = keras.layers.Dense(1, name="out")(keras.layers.Concatenate()([gamma, determinant]))
    model = keras.Model(inputs, outputs, name="kernels")
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_missing_kernels_fall_back_before_the_first_step_and_are_logged(caplog):
    model = _kernel_model()
    plan = PrecisionPlan.uniform(model, "bfloat16").with_dtype("out", "float32")
    x = np.random.default_rng(0).uniform(size=(32, 4)).astype("float32")
    y = np.zeros((32, 1), "float32")
    callback = AutoPrecision(plan, verbose=0)
    with caplog.at_level("WARNING", logger="autoprec"):
        history = model.fit(x, y, epochs=1, batch_size=8, verbose=0, callbacks=[callback])
    paths = layer_paths(model)
    assert paths["lgamma"].compute_dtype == "float32"  # no bfloat16 lgamma on CPU
    assert paths["det"].compute_dtype == "float32"
    assert paths["dense"].compute_dtype == "bfloat16"
    fallen = {
        event["layer"]: event for event in callback.plan.events if event["kind"] == "missing_kernel"
    }
    assert set(fallen) == {"lgamma", "det"}
    assert fallen["det"]["from"] == "bfloat16" and fallen["det"]["to"] == "float32"
    assert "no bfloat16 kernel" in caplog.text
    assert np.isfinite(history.history["loss"][0])


def test_float16_falls_back_to_bfloat16_where_only_that_is_missing():
    model = _kernel_model()
    dtypes = {"dense": "float16", "lgamma": "float16", "det": "float16", "out": "float32"}
    missing = {item.path: item for item in find_missing_kernels(model, dtypes)}
    assert "lgamma" not in missing  # lgamma has a float16 kernel
    assert missing["det"].fallback == "float32"  # neither 16-bit kernel exists
    assert model.get_layer("det").compute_dtype == "float32"  # the check leaves policies alone
