"""Tests for autoprec.profiler.runner: probes inside real Keras training steps, no mocks."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import classification_data
from profiler.reference import assert_matches_reference

from autoprec._backends import tensorflow as tf_backend
from autoprec.errors import ProfileError
from autoprec.profiler import ProbeSession, ProfileCallback, TensorStats, profile


def test_a_tensor_seen_by_two_probes_is_measured_once():
    """An outer layer returning an inner layer's output shares its statistics, forward and back."""
    names = ("inner_fwd", "inner_bwd", "outer_fwd", "outer_bwd")
    accumulators = {name: tf_backend.TensorAccumulator(name) for name in names}
    caches = []

    @tf.function
    def step(x):
        cache = tf_backend.StatisticsCache()
        caches.append(cache)
        with tf.GradientTape() as tape:
            tape.watch(x)
            inner = tf_backend.probe(
                x * 3.0, accumulators["inner_fwd"], accumulators["inner_bwd"], False, cache=cache
            )
            outer = tf_backend.probe(
                inner, accumulators["outer_fwd"], accumulators["outer_bwd"], False, cache=cache
            )
            loss = tf.reduce_sum(outer * outer)
        return tape.gradient(loss, x)

    values = np.random.default_rng(3).normal(size=(4, 5)).astype(np.float32)
    step(tf.constant(values))
    measured = {id(entry) for entry in caches[0]._entries.values()}
    assert len(measured) == 2  # one forward, one backward measurement for four accumulators
    for kind, expected in (("fwd", values * 3.0), ("bwd", 2.0 * values * 3.0)):
        inner = TensorStats.from_raw(*accumulators[f"inner_{kind}"].read())
        outer = TensorStats.from_raw(*accumulators[f"outer_{kind}"].read())
        assert inner.to_dict() == outer.to_dict()
        assert_matches_reference(inner, expected)


def _plain_mlp() -> keras.Model:
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="tanh", name="hidden")(inputs)
    hidden = keras.layers.Dense(16, activation="relu", name="second")(hidden)
    outputs = keras.layers.Dense(3, activation="softmax", name="head")(hidden)
    return keras.Model(inputs, outputs)


def test_recorded_gradients_equal_gradient_tape():
    x, y = classification_data(samples=32)
    model = _plain_mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    names = ["hidden", "second", "head"]
    layers = [model.get_layer(name) for name in names]
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    with tf.GradientTape(persistent=True) as tape:
        activations = []
        value = tf.constant(x)
        for layer in layers:
            value = layer(value)
            tape.watch(value)
            activations.append(value)
        loss = loss_fn(y, value)
    activation_gradients = tape.gradient(loss, activations)
    weight_gradients = tape.gradient(loss, [layer.kernel for layer in layers])
    kernels = [layer.kernel.numpy() for layer in layers]

    prof = profile(model, (x, y), steps=1, batch_size=32)

    assert prof.steps == 1
    assert list(prof.layers) == names
    # Graph and eager kernels may round the last bit differently; the smallest
    # magnitudes come from cancellation, so their relative error is larger.
    tolerances = {"rtol": 1e-4, "min_rtol": 1e-2}
    for index, name in enumerate(names):
        recorded = prof.layers[name]
        assert_matches_reference(recorded.activations["output"], activations[index], **tolerances)
        if activation_gradients[index] is None:
            # The loss reads the softmax's logits (Keras keeps them on the output),
            # so no gradient flows through the head's output itself.
            assert "output" not in recorded.activation_gradients
        else:
            assert_matches_reference(
                recorded.activation_gradients["output"], activation_gradients[index], **tolerances
            )
        assert_matches_reference(
            recorded.weight_gradients["kernel"], weight_gradients[index], **tolerances
        )
        assert_matches_reference(recorded.weights["kernel"], kernels[index])
        assert set(recorded.weight_gradients) == {"kernel", "bias"}


def test_attention_logits_above_float16_max_are_detected():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 6, 8)).astype("float32")
    y = rng.integers(0, 2, size=(16,)).astype("int32")
    inputs = keras.Input((6, 8))
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="attention")
    attended = attention(inputs, inputs)
    pooled = keras.layers.GlobalAveragePooling1D()(attended)
    outputs = keras.layers.Dense(2, activation="softmax")(pooled)
    model = keras.Model(inputs, outputs)
    attention._query_dense.kernel.assign(np.full((8, 2, 4), 40.0, "float32"))
    attention._key_dense.kernel.assign(np.full((8, 2, 4), 40.0, "float32"))
    attention._value_dense.kernel.assign(np.full((8, 2, 4), 1e-3, "float32"))
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="sparse_categorical_crossentropy")

    query = attention._query_dense(x).numpy()
    key = attention._key_dense(x).numpy()
    expected_logits = np.einsum("btnh,bsnh->bnts", query, key)
    assert np.abs(expected_logits).max() > 65504
    prof = profile(model, (x, y), steps=1, batch_size=16)

    layer = prof.layers["attention"]
    logits = layer.internals["attention_logits"]
    assert_matches_reference(logits, expected_logits, rtol=1e-4)
    assert layer.activation.max_abs < 1.0  # the layer's output looks harmless ...
    assert layer.float16_exceeds_max and not layer.float16_safe  # ... its logits are not
    assert prof.layers["attention/query_dense"].activation.max_abs < 65504


class PairLayer(keras.layers.Layer):
    """Returns a float pair and an integer tensor."""

    def call(self, inputs):
        return {"double": inputs * 2.0, "half": inputs * 0.5, "index": keras.ops.argmax(inputs, -1)}


class SubclassedModel(keras.Model):
    def __init__(self):
        super().__init__()
        self.embed = keras.layers.Embedding(10, 4, mask_zero=True)
        self.pool = keras.layers.GlobalAveragePooling1D()
        self.block = keras.Sequential([keras.layers.Dense(6, activation="relu")], name="block")
        self.pair = PairLayer()
        self.frozen = keras.layers.Dense(5, trainable=False)
        self.head = keras.layers.Dense(2, activation="softmax")

    def call(self, inputs):
        pooled = self.pool(self.embed(inputs))
        pair = self.pair(self.block(pooled))
        return self.head(self.frozen(pair["double"] + pair["half"]))


def test_subclassed_nested_model_with_tuple_outputs_masks_and_frozen_layer():
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 10, size=(16, 5)).astype("int32")
    tokens[:, 3:] = 0  # padding the mask must hide
    labels = rng.integers(0, 2, size=(16,)).astype("int32")
    model = SubclassedModel()
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="sparse_categorical_crossentropy")
    model(tokens)
    expected_pool = model.pool(model.embed(tokens)).numpy()
    callback = ProfileCallback(steps=2)
    model.fit(tokens, labels, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    prof = callback.profile

    assert prof.steps == 2
    assert {"embed", "pool", "block/dense", "pair", "frozen", "head"} <= set(prof.layers)
    assert "block" not in prof.layers  # a nested Sequential's output is its last layer's
    assert_matches_reference(prof.layers["pool"].activations["output"], expected_pool)
    assert set(prof.layers["pair"].activations) == {"output/double", "output/half"}
    frozen = prof.layers["frozen"]
    assert frozen.weight_gradients == {} and frozen.activation_gradients["output"].count == 80
    assert set(prof.layers["head"].weight_gradients) == {"kernel", "bias"}
    assert "call" not in vars(model.pair) and "call" not in vars(model.block.layers[0])


def test_recurrent_layers_are_profiled_at_their_outputs_and_cells_keep_weights():
    """Cells run inside a while loop: their weights are recorded, their per-step outputs are not."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 6, 4)).astype("float32")
    y = rng.integers(0, 3, size=(32,)).astype("int32")
    inputs = keras.Input((6, 4))
    hidden = keras.layers.Bidirectional(keras.layers.LSTM(8, return_sequences=True))(inputs)
    hidden = keras.layers.GRU(6)(hidden)
    outputs = keras.layers.Dense(3, activation="softmax", name="head")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")

    prof = profile(model, (x, y), steps=2, batch_size=16)

    for path, count in (("bidirectional", 32 * 6 * 16), ("gru", 32 * 6)):
        layer = prof.layers[path]
        assert layer.activations["output"].count == count
        assert layer.activation_gradients["output"].count == count
    for cell in ("gru/cell", "bidirectional/forward_layer/cell"):
        assert prof.layers[cell].activations == {}
        assert {"kernel", "recurrent_kernel"} <= set(prof.layers[cell].weight_gradients)
        assert prof.layers[cell].weights["kernel"].count > 0


def test_probe_session_records_across_fits_and_leaves_nothing_behind():
    x, y = classification_data(samples=32)
    model = _plain_mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    with ProbeSession(model) as session:
        assert session.steps_recorded() == 0 and session.probed_tensor_count == 0
        with pytest.raises(ProfileError, match="already being profiled"):
            ProbeSession(model).install()
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        prof = session.collect()
        recorded = session.values_recorded()
    assert session.steps_recorded() == 4 and prof.steps == 4
    # per layer: output and its gradient, kernel and bias with their gradients (the head's
    # output gradient is probed too, though it stays empty: the loss reads the logits)
    assert session.probed_tensor_count == 3 * 6
    assert "output" not in prof.layers["head"].activation_gradients
    assert recorded == sum(
        stats.count
        for layer in prof.layers.values()
        for kind in ("activations", "activation_gradients", "weights", "weight_gradients")
        for stats in getattr(layer, kind).values()
    )
    assert prof.layers["hidden"].activations["output"].count == 4 * 16 * 16
    assert "train_step" not in vars(model) and "apply_gradients" not in vars(model.optimizer)
    assert all("call" not in vars(layer) for layer in model.layers)
    with ProbeSession(model):  # the model can be probed again
        pass
