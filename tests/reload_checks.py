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


@keras.saving.register_keras_serializable(package="autoprec_reload")
class TokenGateModel(keras.Model):
    """A subclassed model on token ids that Keras cannot build from its build config (its call
    needs integers): its weightless gate is only built at the first call after a reload."""

    def __init__(self, vocabulary: int = 16, width: int = 8, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary, self.width = vocabulary, width
        policy = self.dtype_policy
        self.embed = keras.layers.Embedding(vocabulary, width, dtype=policy, name="embed")
        self.norm = keras.layers.LayerNormalization(dtype=policy, name="norm")
        self.head = keras.layers.Dense(1, dtype=policy, name="head")
        self.gate = keras.layers.Multiply(dtype=policy, name="gate")

    def call(self, tokens):
        hidden = self.head(self.norm(self.embed(tokens)))
        odd = keras.ops.cast(keras.ops.bitwise_and(tokens, 1), hidden.dtype)
        gated = keras.ops.cast(self.gate([hidden[..., 0], odd + 1.1]), "float32")
        return keras.ops.mean(gated, axis=-1, keepdims=True)

    def get_config(self):
        return {**super().get_config(), "vocabulary": self.vocabulary, "width": self.width}


@keras.saving.register_keras_serializable(package="autoprec_reload")
class LazyBlock(keras.layers.Layer):
    """A block with no `build` of its own that adds its input to its dense layer's output, as
    keras-hub's Swin blocks do: Keras builds `dense` by tracing `call` at the first call."""

    def __init__(self, width: int = 8, **kwargs):
        super().__init__(**kwargs)
        self.width = width
        self.dense = keras.layers.Dense(width, dtype=self.dtype_policy, name="dense")

    def call(self, inputs):
        return inputs + self.dense(inputs)

    def get_config(self):
        return {**super().get_config(), "width": self.width}


@keras.saving.register_keras_serializable(package="autoprec_reload")
class PrefixedBackbone(keras.Model):
    """A functional backbone that names its sub-layers after its own name when it has one, as
    keras-hub's DINOV2Backbone does: `embed` when built, `prefixed_backbone_3_embed` reloaded;
    with `lazy_block`, a `LazyBlock` after its norm."""

    def __init__(self, width=8, name=None, dtype=None, lazy_block: bool = False, **kwargs):
        prefix = f"{name}_" if name else ""
        self.width, self.lazy_block = width, lazy_block
        inputs = keras.Input((6, width), name="tokens")
        self.embed = keras.layers.Dense(width, dtype=dtype, name=f"{prefix}embed")
        self.attention = keras.layers.MultiHeadAttention(
            2, 4, dtype=dtype, name=f"{prefix}attention"
        )
        self.norm = keras.layers.LayerNormalization(dtype=dtype, name=f"{prefix}norm")
        hidden = self.embed(inputs)
        outputs = self.norm(hidden + self.attention(hidden, hidden))
        if lazy_block:
            outputs = LazyBlock(width, dtype=dtype, name=f"{prefix}block")(outputs)
        super().__init__(inputs, outputs, name=name, **kwargs)
        if dtype is not None:  # as keras-hub's Backbone: a functional model drops `dtype`
            self.dtype_policy = keras.dtype_policies.get(dtype)

    def get_config(self):
        dtype = keras.dtype_policies.serialize(self.dtype_policy)
        return {
            **{"width": self.width, "name": self.name, "trainable": self.trainable},
            **{"dtype": dtype, "lazy_block": self.lazy_block},
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def prefixed_classifier(lazy_block: bool = False) -> keras.Model:
    """A functional classifier around a `PrefixedBackbone` built without a name."""
    inputs = keras.Input((6, 8), name="features")
    hidden = PrefixedBackbone(lazy_block=lazy_block)(inputs)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(hidden)
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(pooled), name="prefixed")
