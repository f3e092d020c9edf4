"""Keras interop: a plan as a DTypePolicyMap and back (autoprec/plan/plan.py)."""

from __future__ import annotations

import keras

from autoprec import PrecisionPlan


def test_dtype_policy_map_round_trip_and_keras_accepts_it():
    def build(dtype=None):
        return keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(5, name="first", dtype=dtype),
                keras.layers.Dense(2, name="second", dtype=dtype),
            ],
            name="pair",
        )

    model = build()
    plan = PrecisionPlan.uniform(model, "float32").with_dtype("first", "bfloat16")
    policy_map = plan.to_dtype_policy_map()
    assert isinstance(policy_map, keras.dtype_policies.DTypePolicyMap)
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(policy_map)
    )
    assert PrecisionPlan.from_dtype_policy_map(model, restored) == plan
    rebuilt = build(dtype=restored)
    rebuilt(keras.ops.ones((1, 6)))
    assert rebuilt.get_layer("first").compute_dtype == "bfloat16"
    assert rebuilt.get_layer("second").compute_dtype == "float32"
    assert rebuilt.get_layer("first").kernel.dtype == "float32"


def test_policy_map_is_keyed_by_keras_paths_and_keys_the_rest_by_their_own_path(attention_model):
    plan = PrecisionPlan.uniform(attention_model, "bfloat16").with_dtype("dense", "float32")
    plan = plan.with_dtype("attention/query_dense", "float16")
    policy_map = plan.to_dtype_policy_map()
    assert policy_map.default_policy.name == "mixed_bfloat16"
    assert policy_map["attention/query"].name == "mixed_float16"  # Keras' path, not autoprec's
    assert policy_map["dense"].name == "float32"
    keys = list(policy_map)
    assert "attention/query_dense" not in keys and "attention/attention_output" in keys
    assert "attention/softmax" in keys  # no Keras path: its own, which Keras never looks up
    hand = PrecisionPlan({"head": "float16"}, default="bfloat16").to_dtype_policy_map()
    assert hand["head"].name == "mixed_float16"


def test_dtypes_from_policy_map_reads_every_layer_and_the_default(mlp):
    policy_map = keras.dtype_policies.DTypePolicyMap(default_policy="mixed_bfloat16")
    policy_map["dense_2"] = "float32"
    plan = PrecisionPlan.from_dtype_policy_map(mlp, policy_map)
    assert plan.default == "bfloat16"
    assert plan.resolve() == {
        "dense": "bfloat16",
        "dropout": "bfloat16",
        "dense_1": "bfloat16",
        "dense_2": "float32",
    }
