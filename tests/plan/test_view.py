"""PlanView: the read-only shape of a plan the operations take (autoprec/plan/view.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autoprec import PlanRule, PrecisionPlan
from autoprec.layers import LayerInfo
from autoprec.plan.diff import diff_plans
from autoprec.plan.serialize import plan_to_dict
from autoprec.plan.summary import plan_summary
from autoprec.plan.view import PlanView


@dataclasses.dataclass(frozen=True)
class PlanSnapshot:
    """Another value of the `PlanView` shape: the fields of a plan, copied."""

    layers: Mapping[str, str]
    followers: Mapping[str, str]
    rules: tuple[PlanRule, ...]
    default: str
    layer_info: Mapping[str, LayerInfo]
    fingerprint: str | None
    model_name: str | None
    metadata: Mapping[str, Any]
    events: tuple[Mapping[str, Any], ...]
    created: str
    autoprec_version: str


def _members() -> list[str]:
    return [name for name in vars(PlanView) if isinstance(vars(PlanView)[name], property)]


def test_a_precision_plan_is_a_plan_view(mlp):
    plan = PrecisionPlan.uniform(mlp, "bfloat16")
    assert isinstance(plan, PlanView)
    assert isinstance(PrecisionPlan(default="float16"), PlanView)
    assert sorted(_members()) == sorted(field.name for field in dataclasses.fields(plan))
    assert not isinstance({"layers": {}}, PlanView)


def test_the_operations_read_only_the_view(attention_model):
    plan = (
        PrecisionPlan.uniform(attention_model, "bfloat16")
        .with_rule(class_name="Softmax", dtype="float32")
        .with_event({"step": 1, "layer": "dense"})
    )
    snapshot = PlanSnapshot(**{name: getattr(plan, name) for name in _members()})
    assert isinstance(snapshot, PlanView)
    assert plan_summary(snapshot) == plan.summary()
    assert plan_to_dict(snapshot) == plan.to_dict()
    assert not diff_plans(snapshot, plan)
    assert diff_plans(snapshot, plan.with_dtype("dense", "float16")).changed == (
        ("dense", "bfloat16", "float16"),
    )
