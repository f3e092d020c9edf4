"""Stable layer paths, pass-through detection and fingerprints (autoprec/layers.py)."""

from __future__ import annotations

import keras
from conftest import build_attention_model, build_cnn, build_mlp

from autoprec.layers import DESCRIPTIONS, describe_model, layer_paths, model_fingerprint


class Block(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.denses = [keras.layers.Dense(4), keras.layers.Dense(4)]
        self.heads = {"mean": keras.layers.Dense(2), "scale": keras.layers.Dense(2)}
        self._norm = keras.layers.LayerNormalization()

    def call(self, inputs):
        for dense in self.denses:
            inputs = dense(inputs)
        inputs = self._norm(inputs)
        return self.heads["mean"](inputs) + self.heads["scale"](inputs)


class Net(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.block = Block()
        self.flatten = keras.layers.Flatten()
        self.out = keras.layers.Dense(3)

    def call(self, inputs):
        return self.out(self.flatten(self.block(inputs)))


def test_paths_identical_across_two_builds_of_one_architecture():
    for builder in (build_mlp, build_cnn, build_attention_model):
        first, second = builder(), builder()
        assert list(layer_paths(first)) == list(layer_paths(second))
        assert model_fingerprint(first) == model_fingerprint(second)


def test_auto_names_are_renumbered_locally():
    keras.layers.Dense(1)  # advances Keras' global name counter
    paths = list(layer_paths(build_mlp()))
    assert paths == ["dense", "dropout", "dense_1", "dense_2"]


def test_sub_layers_of_multi_head_attention_have_paths():
    paths = layer_paths(build_attention_model())
    for inner in ("query_dense", "key_dense", "value_dense", "softmax", "output_dense"):
        assert f"attention/{inner}" in paths
    # Keras itself gives the softmax no path before the model is traced.
    assert len(set(paths)) == len(paths)


def test_subclassed_paths_use_attributes_lists_and_dicts_before_build():
    model = Net()
    expected = [
        "block",
        "block/denses/0",
        "block/denses/1",
        "block/heads/mean",
        "block/heads/scale",
        "block/norm",
        "flatten",
        "out",
    ]
    assert list(layer_paths(model)) == expected
    model(keras.ops.ones((2, 3)))
    assert list(layer_paths(model)) == expected
    assert list(layer_paths(Net())) == expected


def test_nested_model_paths_and_following():
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)], name="head")
    inputs = keras.Input((4,))
    model = keras.Model(inputs, inner(keras.layers.Dense(4)(inputs)))
    infos = describe_model(model)
    assert list(infos) == ["dense", "head", "head/dense"]
    assert infos["head"].is_container
    assert infos["head"].follows == "head/dense"
    assert infos["head/dense"].parameters == 4 * 3 + 3


def test_pass_through_layers_follow_their_producer():
    infos = describe_model(build_cnn())
    assert infos["max_pooling2d"].pass_through
    assert infos["max_pooling2d"].follows == "batch_normalization"
    assert infos["flatten"].follows == "max_pooling2d"
    assert not infos["conv2d"].pass_through
    functional = describe_model(build_mlp())
    assert functional["dropout"].follows == "dense"
    attention = describe_model(build_attention_model())
    assert attention["attention/dropout_layer"].follows == "attention/softmax"
    assert not attention["global_average_pooling1d"].pass_through  # averaging is arithmetic


def test_subclassed_pass_through_follows_previous_sibling():
    model = Net()
    model(keras.ops.ones((2, 3)))
    assert describe_model(model)["flatten"].follows == "block"


def test_fingerprint_changes_with_weight_shapes_and_classes():
    base = model_fingerprint(build_mlp())
    assert model_fingerprint(build_mlp(input_dim=9)) != base
    assert model_fingerprint(build_mlp(classes=4)) != base


def test_attention_logits_are_the_float32_scaled_products_and_observed_in_each_call():
    import numpy as np

    from autoprec.layers import attention_logits, observing_attention

    layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    x = np.random.default_rng(0).normal(size=(2, 3, 5)).astype("float32")
    layer(x, x)
    query = layer._query_dense(x)
    key = layer._key_dense(x)
    logits = keras.ops.convert_to_numpy(attention_logits(layer, query, key, True))
    expected = np.einsum("bsnh,btnh->bnts", keras.ops.convert_to_numpy(key), query) / 2.0
    np.testing.assert_allclose(logits, expected, rtol=1e-5)
    assert attention_logits(keras.layers.Dense(2), query, key) is None

    seen = []
    recording = [False]
    layer._compute_attention = observing_attention(
        layer, layer._compute_attention, lambda: seen.append if recording[0] else None
    )
    layer(x, x)
    assert seen == []
    recording[0] = True
    layer(x, x)
    assert len(seen) == 1 and tuple(seen[0].shape) == (2, 2, 3, 3)


def test_a_model_is_described_once_per_structure():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    reads = DESCRIPTIONS.reads
    first = describe_model(model)
    first.pop("dense")  # a copy: the kept description is untouched
    again = describe_model(model)
    assert "dense" in again and DESCRIPTIONS.reads == reads + 1
    model.add(keras.layers.Dense(1))
    model.build((None, 4))
    assert "dense_2" in describe_model(model)
    assert DESCRIPTIONS.reads == reads + 2
