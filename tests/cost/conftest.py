"""Models of the cost tests whose inputs are dicts, lists and nests with dynamic dimensions."""

from __future__ import annotations

import keras
import numpy as np
import pytest

#: The sequence length the batches of these models have; their inputs leave it `None`.
SEQUENCE = 12


class PairSum(keras.layers.Layer):
    """Takes a dict `{"left", "right"}` and adds a projection of the right to the left."""

    def build(self, input_shape):
        self.projection = keras.layers.Dense(input_shape["left"][-1])
        self.projection.build(input_shape["right"])

    def call(self, inputs):
        return inputs["left"] + self.projection(inputs["right"])


def _text_branch(tokens, features):
    embedded = keras.layers.Embedding(50, 6, name="embedding")(tokens)
    mixed = PairSum(name="pair_sum")({"left": embedded, "right": features})
    return keras.layers.GlobalAveragePooling1D(name="pool")(mixed)


@pytest.fixture
def nested_model() -> keras.Model:
    """Inputs `{"text": {"tokens", "features"}, "extra"}`, sequence dimension `None`."""
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    features = keras.Input((None, 4), name="features")
    extra = keras.Input((3,), name="extra")
    joined = keras.layers.Concatenate(name="join")([_text_branch(tokens, features), extra])
    outputs = keras.layers.Dense(2, name="head")(joined)
    model = keras.Model({"text": {"tokens": tokens, "features": features}, "extra": extra}, outputs)
    model.compile(optimizer="adam", loss="mse")
    return model


@pytest.fixture
def list_model() -> keras.Model:
    """Inputs `[tokens, features]`, sequence dimension `None`."""
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    features = keras.Input((None, 4), name="features")
    outputs = keras.layers.Dense(2, name="head")(_text_branch(tokens, features))
    model = keras.Model([tokens, features], outputs)
    model.compile(optimizer="adam", loss="mse")
    return model


@pytest.fixture
def nested_batch() -> tuple[dict, np.ndarray]:
    """`(x, y)` for `nested_model`: 8 samples, sequences of `SEQUENCE` steps."""
    rng = np.random.default_rng(0)
    text = {
        "tokens": rng.integers(0, 50, (8, SEQUENCE)).astype("int32"),
        "features": rng.normal(size=(8, SEQUENCE, 4)).astype("float32"),
    }
    extra = rng.normal(size=(8, 3)).astype("float32")
    return {"text": text, "extra": extra}, np.zeros((8, 2), "float32")


@pytest.fixture
def bert_classifier() -> keras.Model:
    """keras-hub's BERT text classifier, tiny, random weights, dict inputs of dynamic length."""
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=512,
        num_layers=2,
        num_heads=4,
        hidden_dim=64,
        intermediate_dim=128,
        max_sequence_length=32,
    )
    model = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=4, preprocessor=None)
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


@pytest.fixture
def bert_batch() -> tuple[dict, np.ndarray]:
    """16 random sequences of 32 tokens for `bert_classifier`, with labels."""
    rng = np.random.default_rng(0)
    x = {
        "token_ids": rng.integers(0, 512, (16, 32)).astype("int32"),
        "segment_ids": rng.integers(0, 2, (16, 32)).astype("int32"),
        "padding_mask": np.ones((16, 32), "int32"),
    }
    return x, rng.integers(0, 4, (16,)).astype("int32")
