"""PrecisionPlan: lookup, rules, changes, summaries, Keras DTypePolicyMap interop (autoprec/plan/plan.py, rule.py)."""

from __future__ import annotations

import json

import keras
import pytest
from conftest import build_attention_model, build_cnn, build_mlp

import autoprec
from autoprec import PlanError, PlanRule, PrecisionPlan


def test_uniform_names_every_decided_layer_and_reports_followers_apart(mlp):
    plan = PrecisionPlan.uniform(mlp, "bf16")
    assert dict(plan.layers) == {"dense": "bfloat16", "dense_1": "bfloat16", "dense_2": "bfloat16"}
    assert dict(plan.followers) == {"dropout": "dense"}
    assert plan.resolve() == {
        "dense": "bfloat16",
        "dropout": "bfloat16",
        "dense_1": "bfloat16",
        "dense_2": "bfloat16",
    }
    assert plan.fingerprint == autoprec.layers.model_fingerprint(mlp)
    assert plan.model_name == "mlp"
    assert plan.layer_info["dense"].parameters == 8 * 16 + 16
    assert plan.autoprec_version == autoprec.__version__
    for slot in ("hardware", "budget", "reference_metric", "measured_metric", "predicted_speedup"):
        assert slot in plan.metadata


def test_layers_mapping_is_read_only(mlp):
    plan = PrecisionPlan.uniform(mlp, "float32")
    with pytest.raises(TypeError):
        plan.layers["dense"] = "float16"


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


@pytest.mark.parametrize("builder", [build_mlp, build_cnn, build_attention_model])
@pytest.mark.parametrize("make", ["uniform", "from_model", "loaded"])
def test_every_key_of_layers_is_a_valid_with_dtype_path(builder, make):
    model = builder()
    plan = {
        "uniform": lambda: PrecisionPlan.uniform(model, "bfloat16"),
        "from_model": lambda: PrecisionPlan.from_model(model),
        "loaded": lambda: PrecisionPlan.from_json(PrecisionPlan.from_model(model).to_json()),
    }[make]()
    assert plan.followers  # every builder has a pass-through layer
    for path in plan.layers:
        plan = plan.with_dtype(path, "float16")
    assert set(plan.layers.values()) == {"float16"}
    assert set(plan.resolve().values()) == {"float16"}
    assert not set(plan.layers) & set(plan.followers)
    assert set(plan.layers) | set(plan.followers) == set(autoprec.layers.layer_paths(model))


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


def test_from_model_records_current_policies(mlp):
    mlp.get_layer("dense_1").dtype_policy = "mixed_bfloat16"
    mlp.get_layer("dropout").dtype_policy = "mixed_float16"
    plan = PrecisionPlan.from_model(mlp)
    assert plan.layers["dense_1"] == "bfloat16"
    assert plan.layers["dense"] == "float32"
    assert dict(plan.followers) == {"dropout": "dense"}
    assert plan.dtype_for("dropout") == "float32"  # as apply_plan sets it: like its source


@pytest.mark.parametrize("make", ["uniform", "from_model", "loaded"])
def test_with_rule_sets_the_named_layers_it_matches(attention_model, make, tmp_path):
    for layer in autoprec.layers.layer_paths(attention_model).values():
        layer.dtype_policy = "mixed_bfloat16"
    base = PrecisionPlan.uniform(attention_model, "bfloat16")
    plan = {
        "uniform": lambda: base,
        "from_model": lambda: PrecisionPlan.from_model(attention_model),
        "loaded": lambda: PrecisionPlan.load(_saved(base, tmp_path)),
    }[make]()
    assert dict(plan.layers) == dict(base.layers)
    ruled = plan.with_rule(class_name="Softmax", dtype="float32")
    assert ruled.layers["attention/softmax"] == "float32"
    assert ruled.resolve()["attention/dropout_layer"] == "float32"  # follows the softmax
    assert ruled.layers["attention/query_dense"] == "bfloat16"
    assert ruled.rules == (PlanRule(class_name="Softmax", dtype="float32"),)
    both = plan.with_rule(path="attention/*", class_name="*Dense", dtype="float16")
    assert {path for path, dtype in both.layers.items() if dtype == "float16"} == {
        "attention/query_dense",
        "attention/key_dense",
        "attention/value_dense",
        "attention/output_dense",
    }
    assert both.layers["dense"] == "bfloat16"  # a Dense outside attention/


def _saved(plan, folder):
    path = folder / "plan.json"
    plan.save(path)
    return path


def test_with_rule_refuses_what_it_cannot_match(attention_model):
    plan = PrecisionPlan.uniform(attention_model, "bfloat16")
    with pytest.raises(PlanError, match="matches no layer.*did you mean 'Softmax'"):
        plan.with_rule(class_name="softmax", dtype="float32")
    with pytest.raises(PlanError, match="only followers.*follows the dtype of 'attention/softmax'"):
        plan.with_rule(class_name="Dropout", dtype="float32")
    hand_named = PrecisionPlan({"dense": "float16"}, default="bfloat16")
    with pytest.raises(PlanError, match=r"without their class names.*with_dtype\(path, dtype\)"):
        hand_named.with_rule(class_name="Dense", dtype="float32")
    by_path = hand_named.with_rule(path="den*", dtype="float32")
    assert by_path.layers["dense"] == "float32"
    rules_only = PrecisionPlan(default="bfloat16").with_rule(class_name="Softmax", dtype="float32")
    assert rules_only.dtype_for("attention/softmax", "Softmax") == "float32"


def test_with_rule_arguments_are_keyword_only_dtype_last(attention_model):
    plan = PrecisionPlan.uniform(attention_model, "bfloat16")
    with pytest.warns(DeprecationWarning, match="with_rule.*dtype='float32'"):
        old = plan.with_rule("float32", class_name="Softmax")
    assert old == plan.with_rule(class_name="Softmax", dtype="float32")
    with pytest.raises(PlanError, match="keyword-only.*with_rule\\(class_name="):
        plan.with_rule("Softmax", "float32")
    with pytest.raises(PlanError, match="missing dtype"):
        plan.with_rule(class_name="Softmax")
    with pytest.raises(PlanError, match="keyword-only.*PlanRule\\(class_name="):
        PlanRule("float32", class_name="Softmax")


def test_hand_written_plan_with_rules_applies_to_any_model(attention_model):
    text = json.dumps(
        {
            "format_version": 1,
            "default": "bfloat16",
            "rules": [{"class": "Softmax", "dtype": "float32"}],
            "layers": {"dense": "float32"},
        }
    )
    plan = PrecisionPlan.from_json(text)
    handle = autoprec.apply_plan(attention_model, plan)
    assert handle.dtypes["attention/softmax"] == "float32"
    assert handle.dtypes["dense"] == "float32"
    assert handle.dtypes["attention/query_dense"] == "bfloat16"
    assert handle.dtypes["attention/dropout_layer"] == "float32"  # follows the softmax


def test_summary_lists_layers_and_totals(cnn):
    summary = PrecisionPlan.uniform(cnn, "float32").with_dtype("conv2d", "bfloat16").summary()
    assert "conv2d" in summary and "Conv2D" in summary
    assert "bfloat16     1 layers" in summary
    assert "follows" in summary
    conv_parameters = 3 * 3 * 1 * 4 + 4
    assert f"{conv_parameters:>12,} params" in summary


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
