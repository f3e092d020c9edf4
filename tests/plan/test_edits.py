"""Edits: what with_dtype and with_rule set, and their refusals (autoprec/plan/plan.py)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from autoprec import PlanError, PrecisionPlan


def test_with_dtype_returns_new_plan_for_path_glob_and_container(attention_model):
    plan = PrecisionPlan.uniform(attention_model, "bfloat16")
    changed = plan.with_dtype("dense", "float32")
    assert changed is not plan
    assert plan.layers["dense"] == "bfloat16"
    assert changed.layers["dense"] == "float32"
    container = plan.with_dtype("attention", "float16")
    assert all(
        container.layers[path] == "float16"
        for path in container.layers
        if path.startswith("attention")
    )
    assert container.layers["dense"] == "bfloat16"
    globbed = plan.with_dtype("attention/*_dense", "float32")
    assert globbed.layers["attention/query_dense"] == "float32"
    assert globbed.layers["attention/softmax"] == "bfloat16"


def test_with_dtype_names_the_new_order_when_given_dtype_first(mlp):
    plan = PrecisionPlan.uniform(mlp, "float32")
    with pytest.raises(PlanError, match=r"layer comes first.*with_dtype\('dense', 'float16'\)"):
        plan.with_dtype("float16", "dense")


def test_with_dtype_unknown_path_or_empty_glob_names_closest(mlp):
    plan = PrecisionPlan.uniform(mlp, "float32")
    with pytest.raises(PlanError, match="'dense_9'.*did you mean"):
        plan.with_dtype("dense_9", "float16")
    with pytest.raises(PlanError, match="matches no layer"):
        plan.with_dtype("encoder/*", "float16")
    with pytest.raises(PlanError, match="unknown dtype 'float64'"):
        plan.with_dtype("dense", "float64")


def test_layers_with_dtype_keeps_the_order_and_leaves_followers_alone(mlp):
    plan = PrecisionPlan.uniform(mlp, "bfloat16")
    layers = dict(plan.with_dtype("dense*", "fp16").layers)
    assert layers == {"dense": "float16", "dense_1": "float16", "dense_2": "float16"}
    assert list(layers) == list(plan.layers)
    assert "dropout" not in plan.with_dtype("d*", "float32").layers  # a glob reaching a follower
    with pytest.raises(PlanError, match="'dropout' is a pass-through layer.*Set 'dense' instead"):
        plan.with_dtype("drop*", "float32")
    hand = PrecisionPlan({"head": "float32", "body": "bfloat16"})
    assert dict(hand.with_dtype("body", "float16").layers) == {"head": "float32", "body": "float16"}


def test_layers_with_rule_sets_only_what_the_rule_matches(attention_model):
    plan = PrecisionPlan.uniform(attention_model, "bfloat16")
    layers = dict(plan.with_rule(class_name="EinsumDense", dtype="float32").layers)
    assert {path for path, dtype in layers.items() if dtype == "float32"} == {
        "attention/query_dense",
        "attention/key_dense",
        "attention/value_dense",
        "attention/output_dense",
    }
    assert list(layers) == list(plan.layers)
    with pytest.raises(PlanError, match="matches no layer.*did you mean 'Dense'"):
        plan.with_rule(class_name="Dence", dtype="float32")


def test_the_order_hint_takes_dtype_names_and_aliases_only(mlp):
    plan = PrecisionPlan.uniform(mlp, "float32")
    for name in ("float32", "bf16", "fp16", "mixed_bfloat16"):
        with pytest.raises(PlanError, match="the layer comes first"):
            plan.with_dtype(name, "dense")
    with pytest.raises(PlanError, match="unknown dtype 'dense'"):  # float64 is no dtype here
        plan.with_dtype("float64", "dense")


class _Autoencoder(keras.Model):
    """A keras.io-style VAE: two nested functional models and a `train_step`, no `call`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        images = keras.Input((8, 8, 1))
        hidden = keras.layers.Conv2D(4, 3, strides=2, padding="same", activation="relu")(images)
        code = keras.layers.Dense(2)(keras.layers.Flatten()(hidden))
        self.encoder = keras.Model(images, code, name="encoder")
        codes = keras.Input((2,))
        grid = keras.layers.Reshape((4, 4, 1))(keras.layers.Dense(16, activation="relu")(codes))
        pixels = keras.layers.Conv2DTranspose(1, 3, strides=2, padding="same")(grid)
        self.decoder = keras.Model(codes, pixels, name="decoder")


class _FlattensFirst(keras.Model):
    """A subclassed model whose first layer passes values through."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.flatten = keras.layers.Flatten()
        self.dense = keras.layers.Dense(3)

    def call(self, inputs):
        return self.dense(self.flatten(inputs))


def test_every_key_a_plan_lists_is_one_with_dtype_accepts(mlp, cnn, attention_model):
    flattens_first = _FlattensFirst()
    flattens_first(np.zeros((2, 4, 4), "float32"))
    models = [mlp, cnn, attention_model, _Autoencoder(), flattens_first]
    for model in models:
        plans = [
            PrecisionPlan.uniform(model, "float32"),
            PrecisionPlan.uniform(model, "float8"),
            PrecisionPlan.from_model(model),
        ]
        for plan in plans:
            assert plan.layers, model.name
            for path in plan.layers:
                for dtype in ("bfloat16", "float16", "float32"):
                    assert plan.with_dtype(path, dtype).dtype_for(path) == dtype, (model, path)
            for path in plan.followers:
                assert path not in plan.layers
