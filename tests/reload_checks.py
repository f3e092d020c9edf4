"""What a reloaded model must show: the trained model's outputs, bitwise."""

from __future__ import annotations

import keras
import numpy as np


def assert_same_outputs(model: keras.Model, reloaded: keras.Model, x) -> None:
    """Asserts both models' eager outputs on `x` are bitwise equal.

    Eager calls: two traces of one compiled predict function may differ by an ulp.
    """
    expected = keras.ops.convert_to_numpy(model(x, training=False))
    assert np.array_equal(expected, keras.ops.convert_to_numpy(reloaded(x, training=False)))


@keras.saving.register_keras_serializable(package="autoprec_reload")
class ResidualModel(keras.Model):
    """A subclassed model whose own `call` adds two layers' outputs; it builds and names its
    layers in its own policy, as keras-hub's models do (so a policy map reaches them)."""

    def __init__(self, width: int = 8, **kwargs):
        super().__init__(**kwargs)
        self.width = width
        policy = self.dtype_policy
        self.embed = keras.layers.Dense(width, dtype=policy, name="embed")
        self.branch = keras.layers.Dense(width, activation="relu", dtype=policy, name="branch")
        self.norm = keras.layers.LayerNormalization(dtype=policy, name="norm")
        self.head = keras.layers.Dense(1, dtype=policy, name="head")

    def call(self, inputs):
        hidden = self.embed(inputs)
        return self.head(self.norm(hidden + self.branch(hidden)))

    def get_config(self):
        return {**super().get_config(), "width": self.width}


def nested_model() -> keras.Model:
    """A functional model holding a Sequential sub-model and a `MultiHeadAttention`."""
    inputs = keras.Input((6, 8), name="tokens")
    encoder = keras.Sequential(
        [keras.layers.Dense(8, name="proj"), keras.layers.LayerNormalization(name="norm")],
        name="encoder",
    )
    hidden = encoder(inputs)
    attended = keras.layers.MultiHeadAttention(2, 4, name="attention")(hidden, hidden)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(attended + hidden)
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(pooled), name="nested")
