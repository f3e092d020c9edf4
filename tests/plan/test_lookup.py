"""Lookup: which dtype each layer computes in, followers included (autoprec/plan/plan.py)."""

from __future__ import annotations

import pytest

from autoprec import PlanError, PrecisionPlan
from autoprec.layers import describe_model
from autoprec.plan import PlanRule
from autoprec.plan.plan import decided_layers, resolve_followers


def test_lookup_order_exact_then_rules_then_default():
    plan = PrecisionPlan(
        {"encoder/dense": "float16"},
        rules=[
            {"class": "Softmax", "dtype": "float32"},
            {"path": "encoder/*", "dtype": "bfloat16"},
            {"path": "encoder/*", "class": "Dense", "dtype": "float32"},
        ],
        default="bfloat16",
    )
    assert plan.dtype_for("encoder/dense", "Dense") == "float16"
    assert plan.dtype_for("encoder/softmax", "Softmax") == "float32"
    assert plan.dtype_for("encoder/other", "Dense") == "bfloat16"
    assert plan.dtype_for("decoder/x", "Conv2D") == "bfloat16"


def test_pass_through_layers_follow_when_their_source_changes(cnn):
    plan = PrecisionPlan.uniform(cnn, "float32").with_dtype("batch_normalization", "bfloat16")
    assert dict(plan.followers) == {
        "max_pooling2d": "batch_normalization",
        "flatten": "max_pooling2d",
    }
    assert plan.dtype_for("max_pooling2d") == plan.dtype_for("flatten") == "bfloat16"
    assert plan.resolve()["flatten"] == "bfloat16"
    assert "flatten" not in plan.layers
    with pytest.raises(PlanError, match="pass-through.*'batch_normalization'"):
        plan.with_dtype("flatten", "float16")


def test_decided_layers_drop_followers_and_fill_in_from_rules(cnn):
    infos = describe_model(cnn)
    followers = {path: info.follows for path, info in infos.items() if info.follows}
    rules = (PlanRule(class_name="Conv2D", dtype="float16"),)
    explicit = {"dense": "float32", "flatten": "float16", "extra": "bfloat16"}
    decided = decided_layers(explicit, rules, "bfloat16", infos, followers)
    assert decided == {
        "conv2d": "float16",  # by the rule
        "batch_normalization": "bfloat16",  # by the default
        "dense": "float32",  # explicit
        "extra": "bfloat16",  # explicit, not a layer of this model: kept, last
    }
    assert list(decided) == ["conv2d", "batch_normalization", "dense", "extra"]
    hand = {"dense": "float16", "dropout": "float32"}
    assert decided_layers(hand, rules, "float32", {}, {}) == hand  # no model: all decisions


def test_resolve_gives_followers_their_source_dtype_on_any_model(mlp, cnn):
    plan = PrecisionPlan.uniform(mlp, "bfloat16").with_dtype("dense", "float16")
    assert plan.resolve() == {
        "dense": "float16",
        "dropout": "float16",
        "dense_1": "bfloat16",
        "dense_2": "bfloat16",
    }
    rules_only = PrecisionPlan(rules=[{"class": "Conv2D", "dtype": "float16"}], default="bfloat16")
    on_cnn = rules_only.resolve(describe_model(cnn))
    assert on_cnn["conv2d"] == "float16"
    assert on_cnn["max_pooling2d"] == on_cnn["flatten"] == on_cnn["dense"] == "bfloat16"


def test_resolve_followers_walks_chains_and_stops_on_cycles(cnn):
    infos = describe_model(cnn)
    own = {"conv2d": "float32", "batch_normalization": "float16", "dense": "float32"}
    resolved = resolve_followers(own, infos, "bfloat16")
    assert resolved["max_pooling2d"] == resolved["flatten"] == "float16"
    assert list(resolved) == list(infos)
    orphan = resolve_followers({}, infos, "bfloat16")  # no decided source: the default
    assert orphan == {"max_pooling2d": "bfloat16", "flatten": "bfloat16"}


def test_every_layer_lists_decided_layers_and_followers_in_model_order(mlp):
    plan = PrecisionPlan.uniform(mlp, "bfloat16")
    assert list(plan.to_dict()["layers"]) == ["dense", "dropout", "dense_1", "dense_2"]
    hand = PrecisionPlan({"head": "float32", "body": "fp16"})
    assert {path: entry["dtype"] for path, entry in hand.to_dict()["layers"].items()} == {
        "head": "float32",
        "body": "float16",
    }
