"""Tests for autoprec.runtime.training: a model's own train step, and whether it scales its loss."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import autoprec
from autoprec.runtime.training import unscaled_float16_reason


class GAN(keras.Model):
    """The keras.io GAN: no `call`, a `compile` and a `train_step` of its own, two optimizers."""

    def __init__(self, discriminator, generator, latent_dim):
        super().__init__(name="gan")
        self.discriminator, self.generator, self.latent_dim = discriminator, generator, latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

    def train_step(self, real):
        batch = tf.shape(real)[0]
        noise = keras.random.normal((batch, self.latent_dim), seed=self.seed_generator)
        mixed = tf.concat([tf.cast(self.generator(noise), "float32"), real], axis=0)
        labels = tf.concat([tf.ones((batch, 1)), tf.zeros((batch, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, tf.cast(self.discriminator(mixed), "float32"))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        noise = keras.random.normal((batch, self.latent_dim), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            fake = tf.cast(self.discriminator(self.generator(noise)), "float32")
            g_loss = self.loss_fn(tf.zeros((batch, 1)), fake)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        return {"d_loss": d_loss, "g_loss": g_loss}


class ScaledStep(keras.Model):
    """A model with its own train step that scales its loss through `self.optimizer`."""

    def __init__(self):
        super().__init__(name="scaled")
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.head = keras.layers.Dense(1)

    def call(self, inputs):
        return self.head(self.hidden(inputs))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = keras.ops.mean((tf.cast(self(x), "float32") - y) ** 2)
            scaled = self.optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        return {"loss": loss}


def _gan() -> GAN:
    discriminator = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)],
        name="discriminator",
    )
    generator = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(16)],
        name="generator",
    )
    gan = GAN(discriminator, generator, 8)
    gan.compile(
        keras.optimizers.Adam(1e-3),
        keras.optimizers.Adam(1e-3),
        keras.losses.BinaryCrossentropy(from_logits=True),
    )
    return gan


def test_keras_own_train_step_and_a_model_s_own_are_told_apart():
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    assert unscaled_float16_reason(plain) is None
    gan = _gan()
    reason = unscaled_float16_reason(gan)
    assert "'gan'" in reason and "d_optimizer, g_optimizer" in reason
    assert "LossScaleOptimizer" in reason
    scaled = ScaledStep()
    assert unscaled_float16_reason(scaled) is None


@pytest.mark.parametrize(
    ("hardware", "instead"), [("rtx2080ti", "float32"), ("rtx4090", "bfloat16")]
)
def test_a_gan_s_float16_plan_trains_out_of_float16_and_reports_no_scale(hardware, instead, capsys):
    gan = _gan()
    plan = autoprec.PrecisionPlan.uniform(gan, "float16")
    x = np.random.default_rng(0).normal(size=(64, 16)).astype("float32")
    callback = autoprec.AutoPrecision(plan, hardware=hardware)
    history = gan.fit(x, batch_size=16, epochs=2, verbose=0, callbacks=[callback])
    output = capsys.readouterr().out
    assert "trains with its own train_step, which scales no loss" in output
    assert f"6 float16 layer(s) run in {instead}" in output
    assert "loss_scale" not in history.history  # nothing applies a scale: none is reported
    models = ("discriminator", "generator")  # Sequential: Keras rebuilds them in float32
    layers = {path: dtype for path, dtype in callback.handle.dtypes.items() if path not in models}
    assert set(layers.values()) == {instead}
    assert {callback.handle.dtypes[path] for path in models} == {"float32"}
    entry = callback.plan.metadata["evidence"]["discriminator/dense"]
    assert entry["kind"] == "budget" and entry["dtype"] == instead
    assert all(np.isfinite(history.history["d_loss"] + history.history["g_loss"]))


def test_a_train_step_that_scales_its_loss_keeps_float16_with_a_scale():
    model = ScaledStep()
    model.compile(keras.optimizers.Adam(1e-3))
    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    y = x[:, :1] * 2.0
    model(x[:2])
    plan = autoprec.PrecisionPlan.uniform(model, "float16")
    callback = autoprec.AutoPrecision(plan, hardware="rtx2080ti")
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[callback])
    assert "float16" in set(callback.handle.dtypes.values())
    assert history.history["loss_scale"][-1] > 1
    assert np.isfinite(history.history["loss"]).all()
