"""Tests for autoprec.cost.steps: copies of a model with every layer, or each named one, in a dtype."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from autoprec import cost
from autoprec.errors import PlanError
from autoprec.layers import layer_paths


def test_clone_with_uniform_policy_copies_the_model_and_leaves_it_alone(mlp):
    assert not cost.clone_with_uniform_policy(mlp, "float16").compiled
    mlp.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    copy = cost.clone_with_uniform_policy(mlp, "bf16")
    # A compiled model's copy is compiled alike (keras.models.clone_model), with its own optimizer.
    assert copy is not mlp and copy.compiled and copy.optimizer is not mlp.optimizer
    assert [type(layer) for layer in copy.layers] == [type(layer) for layer in mlp.layers]
    assert {layer.dtype_policy.name for layer in layer_paths(copy).values()} == {"mixed_bfloat16"}
    assert {layer.dtype_policy.name for layer in layer_paths(mlp).values()} == {"float32"}
    x = np.ones((2, 8), dtype="float32")
    assert keras.backend.standardize_dtype(copy(x).dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(mlp(x).dtype) == "float32"
    float32 = cost.clone_with_uniform_policy(mlp, "float32")
    assert {layer.dtype_policy.name for layer in layer_paths(float32).values()} == {"float32"}
    float8 = cost.clone_with_uniform_policy(mlp, "float8")
    policies = {
        type(layer).__name__: layer.dtype_policy.name for layer in layer_paths(float8).values()
    }
    assert policies["Dense"] == "float8_from_mixed_bfloat16"
    assert policies["Dropout"] == "mixed_bfloat16"


def test_clone_with_policies_sets_the_named_layers_only_and_names_a_missing_one(mlp):
    path = next(path for path, layer in layer_paths(mlp).items() if layer.weights)
    copy = cost.clone_with_policies(mlp, {path: "f16"})
    assert layer_paths(copy)[path].dtype_policy.name == "mixed_float16"
    others = {p: layer for p, layer in layer_paths(copy).items() if p != path}
    assert {layer.dtype_policy.name for layer in others.values()} == {"float32"}
    assert layer_paths(mlp)[path].dtype_policy.name == "float32"
    with pytest.raises(PlanError, match="'nowhere' is not a layer"):
        cost.clone_with_policies(mlp, {"nowhere": "bfloat16"})
