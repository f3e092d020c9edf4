"""apply_plan: real per-layer dtypes, strictness and restore (autoprec/runtime/apply.py)."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
from conftest import build_attention_model, build_cnn, build_mlp

from autoprec import PlanError, PrecisionPlan, apply_plan
from autoprec.layers import layer_paths


def _output_dtypes(model, sample):
    """Runs the model once and returns each top-level layer's output dtype."""
    outputs = [layer.output for layer in model.layers]
    probe = keras.Model(model.inputs[0], outputs)
    return {
        layer.name: keras.backend.standardize_dtype(value.dtype)
        for layer, value in zip(model.layers, probe(sample))
    }


def test_layers_really_compute_in_planned_dtypes_and_variables_stay_float32():
    model = build_cnn()
    plan = (
        PrecisionPlan.uniform(model, "float32")
        .with_dtype("conv2d", "float16")
        .with_dtype("batch_normalization", "bfloat16")
    )
    handle = apply_plan(model, plan)
    sample = np.ones((2, 12, 12, 1), "float32")
    dtypes = _output_dtypes(model, sample)
    assert dtypes["conv2d"] == "float16"
    assert dtypes["batch_normalization"] == "bfloat16"
    assert dtypes["max_pooling2d"] == "bfloat16"  # pass-through follows its input
    assert dtypes["flatten"] == "bfloat16"
    assert dtypes["dense"] == "float32"
    assert all(variable.dtype == "float32" for variable in model.weights)
    assert handle.uses_float16


def test_setter_reaches_multi_head_attention_sub_layers():
    model = build_attention_model()
    apply_plan(model, PrecisionPlan.uniform(model, "bfloat16"))
    paths = layer_paths(model)
    assert paths["attention/query_dense"].compute_dtype == "bfloat16"
    assert paths["attention/softmax"].compute_dtype == "bfloat16"
    result = model(np.ones((2, 8, 8), "float32"))
    assert np.isfinite(keras.ops.convert_to_numpy(result)).all()


def test_restore_puts_original_policies_back(mlp):
    before = {path: layer.dtype_policy.name for path, layer in layer_paths(mlp).items()}
    handle = apply_plan(mlp, PrecisionPlan.uniform(mlp, "float16"))
    assert layer_paths(mlp)["dense"].compute_dtype == "float16"
    handle.restore()
    after = {path: layer.dtype_policy.name for path, layer in layer_paths(mlp).items()}
    assert after == before


def test_strict_refuses_plan_for_another_model_and_changes_nothing(mlp):
    other = PrecisionPlan.uniform(build_attention_model(), "float16")
    before = {path: layer.dtype_policy.name for path, layer in layer_paths(mlp).items()}
    with pytest.raises(PlanError, match="does not have: 'attention'.*strict=False") as error:
        apply_plan(mlp, other)
    assert "closest: 'dense" in str(error.value)
    after = {path: layer.dtype_policy.name for path, layer in layer_paths(mlp).items()}
    assert after == before


def test_strict_refuses_renamed_layers_with_closest_match(mlp):
    text = PrecisionPlan.uniform(mlp, "bfloat16").to_json().replace('"dense_1"', '"dense_one"')
    with pytest.raises(PlanError, match="'dense_one' \\(closest: 'dense_1'\\)"):
        apply_plan(mlp, PrecisionPlan.from_json(text))


def test_strict_refuses_changed_weight_shapes(mlp):
    plan = PrecisionPlan.uniform(build_mlp(input_dim=5), "bfloat16")
    with pytest.raises(PlanError, match="'dense' has weight shapes"):
        apply_plan(mlp, plan)


def test_non_strict_applies_what_matches_and_warns(mlp):
    plan = PrecisionPlan.uniform(build_mlp(), "bfloat16")
    text = plan.to_json().replace('"dense_2"', '"renamed"')
    with pytest.warns(UserWarning, match="renamed"):
        handle = apply_plan(mlp, PrecisionPlan.from_json(text), strict=False)
    assert handle.dtypes["dense"] == "bfloat16"
    assert handle.dtypes["dense_2"] == "bfloat16"  # not named: the plan's default


def test_unbuilt_model_is_refused_with_a_way_forward():
    model = keras.Sequential([keras.layers.Dense(2)])
    with pytest.raises(PlanError, match="not built.*AutoPrecision"):
        apply_plan(model, PrecisionPlan(default="bfloat16"))


def test_apply_rejects_non_plans(mlp):
    with pytest.raises(PlanError, match="expected a PrecisionPlan"):
        apply_plan(mlp, {"dense": "float16"})


def test_applied_plan_names_every_layer(mlp):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handle = apply_plan(mlp, PrecisionPlan(default="bfloat16"))
    assert set(handle.plan.layers) | set(handle.plan.followers) == set(layer_paths(mlp))
    assert handle.plan.fingerprint is not None
