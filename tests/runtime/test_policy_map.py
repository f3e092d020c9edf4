"""Containers write their sub-layers' policies as a `DTypePolicyMap` (autoprec/runtime/policy_map.py)."""

from __future__ import annotations

import keras
import numpy as np
from conftest import build_attention_model

import autoprec
from autoprec import PrecisionPlan
from autoprec.layers import layer_paths, layer_policy
from autoprec.runtime.policy_map import map_groups, policy_map_of, write_nested_policies


def _attention_under_plan() -> keras.Model:
    model = build_attention_model()
    plan = (
        PrecisionPlan.uniform(model, "bfloat16")
        .with_dtype("attention/query_dense", "float16")
        .with_dtype("attention/softmax", "float32")
    )
    autoprec.apply_plan(model, plan)
    return model


def test_a_plain_graph_model_writes_no_map():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    model(np.zeros((1, 4), "float32"))
    assert map_groups(model) == {}
    assert write_nested_policies(model) == 0
    assert model.get_config()["layers"][1]["config"]["dtype"]["class_name"] == "DTypePolicy"


def test_a_container_that_builds_its_sub_layers_writes_all_of_their_policies():
    model = _attention_under_plan()
    assert list(map_groups(model)) == ["attention"]
    assert write_nested_policies(model) == 1  # already done by apply_plan: counted once
    config = model.get_layer("attention").get_config()
    written = keras.dtype_policies.deserialize(config["dtype"])
    assert isinstance(written, keras.dtype_policies.DTypePolicyMap)
    query = layer_paths(model)["attention/query_dense"]
    assert written[query.path].name == "mixed_float16"
    # Softmax and dropout have no Keras path (never built): they take the map's default.
    assert written.default_policy.name == "float32"


def test_keras_alone_reloads_every_sub_layer_in_its_dtype(tmp_path):
    model = _attention_under_plan()
    x = np.random.default_rng(0).normal(size=(2, 8, 8)).astype("float32")
    expected = keras.ops.convert_to_numpy(model(x))
    model.save(tmp_path / "m.keras")
    reloaded = keras.saving.load_model(tmp_path / "m.keras")
    for path, layer in layer_paths(model).items():
        assert layer_policy(layer_paths(reloaded)[path]).name == layer_policy(layer).name, path
    np.testing.assert_allclose(keras.ops.convert_to_numpy(reloaded(x)), expected, atol=1e-2)


def test_the_map_follows_later_policy_changes():
    model = _attention_under_plan()
    autoprec.apply_plan(model, PrecisionPlan.uniform(model, "float32"))
    written = keras.dtype_policies.deserialize(model.get_layer("attention").get_config()["dtype"])
    query = layer_paths(model)["attention/query_dense"]
    assert written[query.path].name == "float32"
    assert policy_map_of(model, keras.dtype_policies.get("float32"))[query.path].name == "float32"


@keras.saving.register_keras_serializable(package="autoprec_tests")
class Block(keras.layers.Layer):
    """Builds its sub-layers itself, unnamed, from its own `dtype` (as keras-hub's blocks do)."""

    def __init__(self, units=4, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.dense = keras.layers.Dense(units, dtype=self.dtype_policy)
        self.norm = keras.layers.LayerNormalization(dtype=self.dtype_policy)

    def build(self, input_shape):
        self.dense.build(input_shape)
        self.norm.build((*input_shape[:-1], self.units))

    def call(self, inputs):
        return self.norm(self.dense(inputs))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def _block_model() -> keras.Model:
    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.Dense(1, name="out")(Block(name="block")(inputs)))


def test_a_reload_that_numbers_keras_made_names_otherwise_finds_every_dtype(tmp_path):
    _block_model()  # a model built before: Keras numbers the next unnamed layers on
    model = _block_model()
    paths = layer_paths(model)
    assert paths["block/dense"].path != "block/dense"  # numbered by the process
    plan = PrecisionPlan.uniform(model, "float32").with_dtype("block/dense", "bfloat16")
    autoprec.apply_plan(model, plan.with_dtype("block/norm", "float16"))
    written = keras.dtype_policies.deserialize(model.get_layer("block").get_config()["dtype"])
    assert written["block/dense_999"].name == "mixed_bfloat16"  # any number Keras gives it
    assert written["out"].name == "float32"
    model.save(tmp_path / "m.keras")
    reloaded = keras.saving.load_model(tmp_path / "m.keras")
    again = layer_paths(reloaded)
    assert again["block/dense"].path != paths["block/dense"].path  # numbered otherwise
    assert again["block/dense"].compute_dtype == "bfloat16"
    assert again["block/norm"].compute_dtype == "float16"
    assert again["block"].compute_dtype == "float32" and again["out"].compute_dtype == "float32"
