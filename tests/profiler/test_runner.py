"""Tests for autoprec.profiler.runner: probes, profile() and ProfileCallback on real models, no mocks."""

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
from profiler.reference import assert_matches_reference

from autoprec._backends import tensorflow as tf_backend
from autoprec.errors import BackendError, ProfileError
from autoprec.profiler import ProbeSession, ProfileCallback, TensorStats, profile


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
