"""The kernel check replays every model `fit` trains (autoprec/runtime/check.py).

A subclassed model with a call of its own, a keras.io-style VAE with none (its
`train_step` steps its encoder and decoder) and a model whose inputs leave a length
unknown each train under an explicit bfloat16 plan whose user layer draws float32
noise in `call`: the check finds the layer and it runs in float32, no `TypeError`.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import autoprec
from autoprec.layers import layer_paths
from autoprec.runtime.check import PROBE_LENGTH, trace_for_check
from autoprec.runtime.kernels import find_missing_kernels


class Jitter(keras.layers.Layer):
    """Adds float32 noise drawn in `call`: its own arithmetic mixes dtypes in 16-bit."""

    def call(self, inputs):
        return inputs + 0.1 * keras.random.normal(keras.ops.shape(inputs))


class Sampling(keras.layers.Layer):
    """The keras.io VAE layer: float32 noise drawn in `call`."""

    def call(self, inputs):
        mean, log_var = inputs
        return mean + keras.ops.exp(0.5 * log_var) * keras.random.normal(keras.ops.shape(mean))


class TenthStep(keras.layers.Layer):
    """Reads the tenth step of a sequence: an input shorter than that fails."""

    def call(self, inputs):
        return inputs[:, 9]


class TokenNet(keras.Model):
    """A subclassed model of token ids: no symbolic inputs, built by calling it."""

    def __init__(self):
        super().__init__(name="token_net")
        self.embedding = keras.layers.Embedding(12, 4, name="embedding")
        self.dense = keras.layers.Dense(4, name="dense")
        self.jitter = Jitter(name="jitter")
        self.pool = keras.layers.GlobalAveragePooling1D(name="pool")
        self.out = keras.layers.Dense(1, name="out")

    def call(self, tokens):
        return self.out(self.pool(self.jitter(self.dense(self.embedding(tokens)))))


class FeatureNet(keras.Model):
    """A subclassed model of float features."""

    def __init__(self):
        super().__init__(name="feature_net")
        self.dense = keras.layers.Dense(6, name="dense")
        self.jitter = Jitter(name="jitter")
        self.out = keras.layers.Dense(1, name="out")

    def call(self, features):
        return self.out(self.jitter(self.dense(features)))


class VAE(keras.Model):
    """keras.io's VAE: no call of its own, a train step through its encoder and decoder."""

    def __init__(self, encoder, decoder):
        super().__init__(name="vae")
        self.encoder, self.decoder = encoder, decoder

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, _, z = self.encoder(data)
            reconstruction = keras.ops.cast(self.decoder(z), "float32")
            loss = keras.ops.mean((reconstruction - data) ** 2)
            loss += 1e-3 * keras.ops.mean(keras.ops.cast(z_mean, "float32") ** 2)
        gradients = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_weights))
        return {"loss": loss}


def _vae() -> VAE:
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    mean = keras.layers.Dense(2, name="z_mean")(hidden)
    log_var = keras.layers.Dense(2, name="z_log_var")(hidden)
    z = Sampling(name="sampling")([mean, log_var])
    encoder = keras.Model(inputs, [mean, log_var, z], name="encoder")
    latent = keras.Input((2,))
    decoder = keras.Model(
        latent, keras.layers.Dense(6, name="reconstruction")(latent), name="decoder"
    )
    vae = VAE(encoder, decoder)
    vae.compile(optimizer="adam")
    return vae


def _fit_bfloat16(model, x, y=None):
    callback = autoprec.AutoPrecision(autoprec.PrecisionPlan.uniform(model, "bfloat16"), verbose=0)
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[callback])
    assert np.isfinite(history.history["loss"][0])
    return callback


def test_a_subclassed_model_of_token_ids_is_checked_at_the_shapes_it_was_built_with(caplog):
    model = TokenNet()
    x = np.random.default_rng(0).integers(1, 12, size=(8, 7)).astype("int32")
    model(x[:2])
    model.compile(optimizer="sgd", loss="mse")
    trace = trace_for_check(model)
    assert trace is not None and trace.calls["jitter"][0].outputs[0].shape == (None, 7, 4)
    with caplog.at_level("INFO", logger="autoprec"):
        callback = _fit_bfloat16(model, x, np.zeros((8, 1), "float32"))
    assert "kernel check skipped" not in caplog.text
    assert [(e["layer"], e["kind"]) for e in callback.plan.events] == [
        ("jitter", "mixed_arithmetic")
    ]
    assert model.jitter.compute_dtype == "float32" and model.dense.compute_dtype == "bfloat16"


def test_a_subclassed_model_of_features_is_checked_and_trains():
    model = FeatureNet()
    x = np.random.default_rng(0).normal(size=(8, 5)).astype("float32")
    model(x[:2])
    model.compile(optimizer="sgd", loss="mse")
    found = find_missing_kernels(model, autoprec.PrecisionPlan.uniform(model, "bfloat16").resolve())
    assert [(item.path, item.kind) for item in found] == [("jitter", "mixed_arithmetic")]
    _fit_bfloat16(model, x, np.zeros((8, 1), "float32"))
    assert model.jitter.compute_dtype == "float32" and model.out.compute_dtype == "bfloat16"


def test_a_vae_with_no_call_of_its_own_is_checked_through_its_encoder_and_decoder():
    vae = _vae()
    trace = trace_for_check(vae)
    assert trace is not None
    assert {"encoder/sampling", "decoder/reconstruction"} <= set(trace.calls)
    x = np.random.default_rng(0).normal(size=(8, 6)).astype("float32")
    callback = _fit_bfloat16(vae, x)
    assert [(e["layer"], e["kind"]) for e in callback.plan.events] == [
        ("encoder/sampling", "mixed_arithmetic")
    ]
    paths = layer_paths(vae)
    assert paths["encoder/sampling"].compute_dtype == "float32"
    assert paths["decoder/reconstruction"].compute_dtype == "bfloat16"


def test_unknown_lengths_are_traced_at_the_probe_length():
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    hidden = keras.layers.Embedding(12, 4, name="embedding")(tokens)
    model = keras.Model(tokens, keras.layers.Dense(1, name="out")(hidden))
    trace = trace_for_check(model)
    assert trace.calls["out"][0].inputs[0].shape == (None, PROBE_LENGTH, 4)


def test_a_model_that_refuses_every_probe_is_left_as_planned_and_said_so(caplog):
    steps = keras.Input((None, 3), name="steps")
    tenth = TenthStep(name="tenth")(keras.layers.Dense(3, name="dense")(steps))
    model = keras.Model(steps, keras.layers.Dense(1, name="out")(tenth))
    with caplog.at_level("INFO", logger="autoprec"):
        found = find_missing_kernels(
            model, autoprec.PrecisionPlan.uniform(model, "bfloat16").resolve()
        )
    assert found == []
    assert "kernel check skipped: model input 'steps' has unknown dimensions" in caplog.text
    assert f"at a length of {PROBE_LENGTH} it raised" in caplog.text
    assert model.get_layer("tenth").compute_dtype == "float32"  # the check changes nothing
