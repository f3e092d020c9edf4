"""The rule engine: PlanRule, reading rules, with_rule and what a rule reaches (autoprec/plan/rules.py)."""

from __future__ import annotations

import dataclasses

import pytest

import autoprec
from autoprec import PlanError, PrecisionPlan
from autoprec.plan import PlanRule
from autoprec.plan.rules import coerce_rule, first_rule_dtype, rule_targets


def test_rule_matches_every_glob_it_has():
    softmax = PlanRule(class_name="Softmax", dtype="float32")
    assert softmax.matches("attention/softmax", "Softmax")
    assert not softmax.matches("attention/softmax", None)  # a class rule needs the class
    assert not softmax.matches("dense", "Dense")
    both = PlanRule(path="attention/*", class_name="*Dense", dtype="float16")
    assert both.matches("attention/block/query_dense", "EinsumDense")  # `*` crosses `/`
    assert not both.matches("dense", "Dense")
    assert PlanRule(path="head", dtype="float32").matches("head", None)


def test_rule_writes_as_plan_json_and_reads_back():
    rule = PlanRule(path="encoder/*", class_name="Dense", dtype="float32")
    assert rule.to_dict() == {"path": "encoder/*", "class": "Dense", "dtype": "float32"}
    assert coerce_rule(rule.to_dict(), 0) == rule
    assert str(rule) == "rule path='encoder/*', class='Dense' -> float32"
    assert coerce_rule(PlanRule(class_name="Softmax", dtype="fp32"), 0).dtype == "float32"
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.dtype = "float16"


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("Softmax", r"plan.json: rules\[2\]: expected an object"),
        ({"class": "Softmax", "dtype": "float32", "kind": "x"}, r"unknown key\(s\) \['kind'\]"),
        ({"class": "Softmax"}, r"rules\[2\]: missing 'dtype'"),
        ({"dtype": "float32"}, r"give 'path'.*or 'class'"),
        ({"class": 3, "dtype": "float32"}, r"rules\[2\]\.class: expected a string, got int"),
        ({"class": "Softmax", "dtype": "float64"}, r"rules\[2\]\.dtype.*float64"),
    ],
)
def test_coerce_rule_names_the_rule_and_the_fix(rule, message):
    with pytest.raises(PlanError, match=message):
        coerce_rule(rule, 2, "plan.json")


def test_with_rule_builds_its_rule_from_the_keywords():
    plan = PrecisionPlan(default="bfloat16").with_rule(class_name="Softmax", dtype="fp32")
    assert plan.rules == (PlanRule(class_name="Softmax", dtype="float32"),)
    plan = plan.with_rule(path="head", dtype="bf16")
    assert plan.rules[1] == PlanRule(path="head", dtype="bfloat16")
    with pytest.raises(PlanError, match="with_rule: missing dtype"):
        plan.with_rule(class_name="Softmax")
    with pytest.raises(PlanError, match=r"rules\[2\]: give 'path'"):
        plan.with_rule(dtype="float32")


def test_first_matching_rule_wins_else_the_default():
    rules = (
        PlanRule(class_name="Softmax", dtype="float32"),
        PlanRule(path="encoder/*", dtype="bfloat16"),
        PlanRule(path="encoder/*", class_name="Dense", dtype="float16"),
    )
    assert first_rule_dtype(rules, "encoder/softmax", "Softmax", "float16") == "float32"
    assert first_rule_dtype(rules, "encoder/dense", "Dense", "float32") == "bfloat16"
    assert first_rule_dtype(rules, "decoder/dense", "Dense", "float32") == "float32"
    assert first_rule_dtype((), "anything", None, "bfloat16") == "bfloat16"


def test_rule_targets_are_the_decided_layers_a_rule_matches(attention_model):
    plan = PrecisionPlan.uniform(attention_model, "bfloat16")
    where = (plan.layers, plan.followers, plan.layer_info)
    assert rule_targets(PlanRule(class_name="Softmax", dtype="float32"), *where) == [
        "attention/softmax"
    ]
    assert rule_targets(PlanRule(class_name="*Normalization", dtype="float32"), *where) == [
        "layer_normalization"
    ]
    with pytest.raises(PlanError, match="only followers"):
        rule_targets(PlanRule(class_name="Dropout", dtype="float32"), *where)
    assert rule_targets(PlanRule(class_name="Softmax", dtype="float32"), {}, {}, {}) == []
    hand = {"dense": "float16", "head": "float32"}
    assert rule_targets(PlanRule(path="he*", dtype="float32"), hand, {}, {}) == ["head"]


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
    with pytest.raises(TypeError, match="positional"):
        plan.with_rule("float32", class_name="Softmax")
    with pytest.raises(TypeError, match="positional"):
        plan.with_rule("Softmax", "float32")
    with pytest.raises(PlanError, match="missing dtype"):
        plan.with_rule(class_name="Softmax")
    with pytest.raises(TypeError, match="positional"):
        PlanRule("float32", class_name="Softmax")
    with pytest.raises(PlanError, match=r"PlanRule: missing dtype.*PlanRule\(class_name="):
        PlanRule(class_name="Softmax")
