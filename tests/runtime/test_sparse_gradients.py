"""An Embedding's sparse gradient that overflows in float16 is skipped, never applied, with the
guard on (autoprec/runtime/loss_scale.py, autoprec/_backends/tensorflow.py)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from autoprec import AutoPrecision, PrecisionPlan
from autoprec.runtime.loss_scale import FlooredLossScaleOptimizer

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="IndexedSlices are TensorFlow's"
)  # JAX differentiates a gather into a dense gradient, which Keras checks whole


def _amplified_embedding() -> keras.Model:
    """A float16 Embedding whose first position is amplified x60000: under a loss scale of 2**15
    its gradient row overflows float16, the second position's row of the same token does not."""
    inputs = keras.Input((2,), dtype="int32")
    rows = keras.layers.Embedding(8, 4, name="embed")(inputs)
    factor = np.array([[60000.0], [1.0]], "float32")
    logits = keras.layers.Lambda(
        lambda t: ops.mean(t * ops.cast(factor, t.dtype), axis=(1, 2)), name="amplify"
    )(rows)
    model = keras.Model(inputs, logits)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.BinaryCrossentropy(True))
    return model


def test_a_repeated_index_does_not_hide_an_overflowing_slice():
    optimizer = FlooredLossScaleOptimizer(keras.optimizers.SGD(0.1))
    variable = keras.Variable(np.zeros((8, 4), "float32"))
    optimizer.build([variable])
    overflowing_then_finite = tf.IndexedSlices(
        tf.constant([[np.inf, 0, 0, 0], [1.0, 1, 1, 1]]), tf.constant([3, 3]), tf.constant([8, 4])
    )
    assert not bool(optimizer.check_finite([overflowing_then_finite]))
    finite = tf.IndexedSlices(tf.ones((2, 4)), tf.constant([3, 3]), tf.constant([8, 4]))
    assert bool(optimizer.check_finite([finite]))


def test_weights_stay_finite_when_an_embedding_gradient_overflows_with_the_guard_on():
    model = _amplified_embedding()
    x = np.full((16, 2), 3, "int32")  # one token at both positions: its slices repeat an index
    y = np.ones(16, "float32")
    callback = AutoPrecision(PrecisionPlan.uniform(model, "float16"), verbose=0)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    assert int(model.optimizer.non_finite_steps.numpy()) > 0  # the overflow happened
    for variable in model.variables + model.optimizer.variables:
        assert np.isfinite(ops.convert_to_numpy(variable)).all(), variable.path
