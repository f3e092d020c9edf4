"""PlanDiff: what two plans decide differently (autoprec/plan/plan.py)."""

from __future__ import annotations

import itertools

from conftest import build_attention_model, build_mlp

from autoprec import PrecisionPlan
from autoprec.plan import PlanRule


def test_diff_lists_changes():
    first = PrecisionPlan.uniform(build_mlp(), "float32")
    second = first.with_dtype("dense_1", "bfloat16")
    diff = first.diff(second)
    assert diff.changed == (("dense_1", "float32", "bfloat16"),)
    assert "dense_1" in str(diff)
    assert not first.diff(first)
    assert str(first.diff(first)) == "plans are identical"


def test_diff_shows_rule_and_default_differences():
    rules_only = PrecisionPlan(rules=[{"class": "Softmax", "dtype": "float32"}], default="bfloat16")
    other = PrecisionPlan(rules=[{"path": "head", "dtype": "float32"}], default="float16")
    diff = rules_only.diff(other)
    assert diff.rules_changed == (rules_only.rules, other.rules)
    assert diff.default_changed == ("bfloat16", "float16")
    assert str(diff).splitlines() == [
        "default: bfloat16 -> float16",
        "- rules[0]: rule class='Softmax' -> float32",
        "+ rules[0]: rule path='head' -> float32",
    ]
    first, second = PlanRule(class_name="A", dtype="float32"), PlanRule(path="b", dtype="float16")
    swapped = PrecisionPlan(rules=[first, second]).diff(PrecisionPlan(rules=[second, first]))
    assert swapped and "rules[" in str(swapped)  # order decides which rule wins


def test_diff_is_empty_exactly_when_plans_are_equal(tmp_path):
    model = build_attention_model()
    uniform = PrecisionPlan.uniform(model, "bfloat16")
    ruled = uniform.with_rule(class_name="Softmax", dtype="float32")
    path = tmp_path / "plan.json"
    ruled.save(path)
    plans = [
        uniform,
        uniform.with_metadata(measured_metric=0.5),  # metadata is evidence, not a decision
        ruled,
        PrecisionPlan.load(path),
        uniform.with_dtype("attention/softmax", "float32"),  # same layers as ruled, no rule
        PrecisionPlan.from_model(model),
        PrecisionPlan.uniform(model, "float32"),
        PrecisionPlan(rules=[{"class": "Softmax", "dtype": "float32"}], default="bfloat16"),
        PrecisionPlan(default="bfloat16"),
    ]
    for first, second in itertools.product(plans, repeat=2):
        assert bool(first.diff(second)) == (first != second), (first, second, first.diff(second))
        assert (str(first.diff(second)) == "plans are identical") == (first == second)
    assert ruled != plans[4] and ruled.diff(plans[4]).rules_changed is not None
    assert plans[0] == plans[1] and ruled == plans[3]


def test_diff_plans_lists_layers_only_one_plan_names(mlp):
    uniform = PrecisionPlan.uniform(mlp, "bfloat16")
    hand = PrecisionPlan({"dense": "float16", "head": "float32"}, default="bfloat16")
    diff = uniform.diff(hand)
    assert diff.changed == (("dense", "bfloat16", "float16"),)
    assert diff.only_in_self == ("dense_1", "dense_2")
    assert diff.only_in_other == ("head",)
    assert diff.default_changed is None and diff.rules_changed is None
    assert str(diff).splitlines() == [
        "~ dense  bfloat16 -> float16",
        "- dense_1",
        "- dense_2",
        "+ head",
    ]
    assert hand.diff(uniform).only_in_self == ("head",)
