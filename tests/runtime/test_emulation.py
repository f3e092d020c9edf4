"""Tests for `autoprec.runtime.emulation`: float16 numerics in float32 math, checked against float16."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from autoprec.layers import describe_model
from autoprec.plan import PrecisionPlan
from autoprec.runtime import apply_plan
from autoprec.runtime.emulation import (
    BOTH_SIDES,
    INPUTS_ONLY,
    Float16Emulation,
    emulated_layers,
    round_to_float16,
    without_float16,
)


def _regression(offset: float = 3000.3, width: int = 32) -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(width, activation="relu", name="hidden")(inputs)
    outputs = keras.layers.Dense(
        1, bias_initializer=keras.initializers.Constant(offset), name="head"
    )(hidden)
    return keras.Model(inputs, outputs)


def test_round_to_float16_rounds_floats_and_passes_everything_else():
    values = round_to_float16(tf.constant([3001.0, 1e5, 1e-9, 0.1], "float32"))
    assert values.dtype == tf.float32
    np.testing.assert_array_equal(values.numpy()[:3], [3000.0, np.inf, 0.0])
    assert values.numpy()[3] == np.float32(np.float16(0.1))
    integers = tf.constant([70000], "int32")
    assert round_to_float16(integers) is integers
    assert round_to_float16(None) is None and round_to_float16(True) is True
    halves = tf.constant([1.5], "bfloat16")
    assert round_to_float16(halves) is halves


def test_emulated_layers_round_float32_children_of_float16_containers_on_their_inputs():
    dtypes = {
        "attention": "float16",
        "attention/query_dense": "float16",
        "attention/softmax": "float32",
        "norm": "float32",
        "head": "bfloat16",
    }
    assert emulated_layers(dtypes) == {
        "attention": BOTH_SIDES,
        "attention/query_dense": BOTH_SIDES,
        "attention/softmax": INPUTS_ONLY,
    }
    assert emulated_layers({"a": "float32", "b": "bfloat16"}) == {}


def test_emulation_matches_native_float16_where_float16_rounding_dominates():
    x = np.random.default_rng(0).normal(size=(16, 8)).astype("float32")
    float32_model = _regression()
    exact = float32_model.predict(x, verbose=0)

    native = _regression()
    apply_plan(native, PrecisionPlan.uniform(native, "float16"))
    native_prediction = native.predict(x, verbose=0)

    emulated = _regression()
    emulation = Float16Emulation(emulated)
    emulation.install()
    emulation.set_layers(emulated_layers({"hidden": "float16", "head": "float16"}))
    emulated_prediction = emulated.predict(x, verbose=0)

    # float16 values near 3000 are 2 apart: both land on that grid, float32 does not.
    assert np.all(np.mod(emulated_prediction, 2.0) == 0)
    assert np.all(np.mod(native_prediction, 2.0) == 0)
    assert not np.all(np.mod(exact, 2.0) == 0)
    np.testing.assert_allclose(emulated_prediction, native_prediction, atol=2.0)

    emulation.set_layers(())
    emulated.predict_function = None
    np.testing.assert_allclose(emulated.predict(x, verbose=0), exact, rtol=1e-6)
    emulation.remove()
    assert "call" not in vars(emulated.get_layer("head"))


def test_emulation_overflows_and_underflows_like_float16_in_both_passes():
    model = _regression(offset=0.0)
    emulation = Float16Emulation(model)
    emulation.install()
    emulation.set_layers({"head"})
    large = np.full((2, 8), 1e6, "float32")
    # hidden (float32) outputs beyond 65504 become inf where head reads them.
    assert not np.isfinite(model(large)).any()
    emulation.set_layers(())
    assert np.isfinite(model(large)).all()
    emulation.set_layers({"head"})

    tiny_scale = 1e-12
    x = tf.constant(np.random.default_rng(1).normal(size=(4, 8)), "float32")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x)) * tiny_scale
    emulated_gradient = tape.gradient(loss, model.get_layer("hidden").kernel)
    emulation.set_layers(())
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x)) * tiny_scale
    exact_gradient = tape.gradient(loss, model.get_layer("hidden").kernel)
    # The gradient reaching the head's input is below float16's smallest subnormal.
    assert np.count_nonzero(exact_gradient.numpy()) > 0
    assert np.count_nonzero(emulated_gradient.numpy()) == 0
    emulation.remove()


def test_without_float16_keeps_other_dtypes_and_applies_as_float32():
    model = _regression()
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("hidden", "bfloat16")
    infos = describe_model(model)
    native = without_float16(plan, infos)
    resolved = native.resolve(infos)
    assert resolved["hidden"] == "bfloat16" and resolved["head"] == "float32"
    assert "float16" not in resolved.values()
    handle = apply_plan(model, native)
    assert not handle.uses_float16


@pytest.mark.parametrize("how", [BOTH_SIDES, INPUTS_ONLY])
def test_emulated_training_stays_finite_with_loss_scaling(how):
    model = _regression()
    emulation = Float16Emulation(model)
    emulation.install()
    emulation.set_layers({"hidden": BOTH_SIDES, "head": how})
    from autoprec.runtime import FlooredLossScaleOptimizer

    model.compile(optimizer=FlooredLossScaleOptimizer(keras.optimizers.Adam(1e-3)), loss="mse")
    rng = np.random.default_rng(2)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = (3000.0 + x[:, :1]).astype("float32")
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert all(np.isfinite(w).all() for w in model.get_weights())
