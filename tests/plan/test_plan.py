"""PrecisionPlan: the frozen value, its construction and its public methods (autoprec/plan/plan.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import build_attention_model, build_cnn, build_mlp

import autoprec
from autoprec import PlanError, PrecisionPlan
from autoprec.plan import METADATA_SLOTS


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


def test_a_plan_is_a_frozen_value(mlp):
    plan = PrecisionPlan.uniform(mlp, "float32").with_metadata(evidence={"dense": "why"})
    for name in ("layers", "followers", "rules", "default", "metadata", "events", "created"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(plan, name, None)
    with pytest.raises(TypeError):
        plan.metadata["hardware"] = "rtx4090"
    with pytest.raises(TypeError):
        plan.followers["dense"] = "dropout"
    assert dict(plan.metadata) == {**dict.fromkeys(METADATA_SLOTS), "evidence": {"dense": "why"}}


def test_constructor_copies_what_it_is_given(mlp):
    metadata = {"evidence": {"dense": {"why": "head"}}}
    event = {"step": 3, "layer": "dense"}
    plan = PrecisionPlan({"dense": "fp16"}, metadata=metadata, events=[event], created="2024-01-01")
    metadata["evidence"]["dense"]["why"] = "changed"
    event["step"] = 99
    assert plan.metadata["evidence"] == {"dense": {"why": "head"}}
    assert plan.events[0]["step"] == 3
    assert plan.created == "2024-01-01"
    assert plan.layers == {"dense": "float16"}
    with pytest.raises(PlanError, match=r"layers\['dense'\].*float64"):
        PrecisionPlan({"dense": "float64"})


def test_with_metadata_and_with_event_return_new_plans(mlp):
    plan = PrecisionPlan.uniform(mlp, "bfloat16")
    measured = plan.with_metadata(measured_metric=0.91, hardware="rtx4090")
    promoted = measured.with_event({"step": 3, "layer": "dense", "to": "float32"})
    assert plan.metadata["measured_metric"] is None and not plan.events
    assert measured.metadata["measured_metric"] == 0.91
    assert measured.metadata["hardware"] == "rtx4090"
    assert promoted.metadata == measured.metadata
    assert [dict(event) for event in promoted.events] == [
        {"step": 3, "layer": "dense", "to": "float32"}
    ]
    assert promoted == plan  # metadata and events are evidence, not decisions
    assert promoted.created == plan.created and promoted.layer_info == plan.layer_info


def test_equal_plans_hash_alike_and_print_their_counts(mlp):
    first = PrecisionPlan.uniform(mlp, "bfloat16").with_dtype("dense_2", "float32")
    second = PrecisionPlan.uniform(mlp, "bfloat16").with_dtype("dense_2", "float32")
    assert first == second and hash(first) == hash(second)
    assert len({first, second, PrecisionPlan.uniform(mlp, "bfloat16")}) == 2
    assert first != "plan"
    assert (
        repr(first) == "PrecisionPlan('mlp', float32=1, bfloat16=2, float16=0, default='bfloat16')"
    )


def test_uses_float16_sees_layers_rules_and_default(mlp):
    plan = PrecisionPlan.uniform(mlp, "bfloat16")
    assert not plan.uses_float16
    assert plan.with_dtype("dense", "float16").uses_float16
    assert PrecisionPlan(default="float16").uses_float16
    assert PrecisionPlan(rules=[{"class": "Dense", "dtype": "float16"}]).uses_float16
    assert plan.dtype_counts() == {"float32": 0, "bfloat16": 3, "float16": 0}


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


def test_from_model_records_current_policies(mlp):
    mlp.get_layer("dense_1").dtype_policy = "mixed_bfloat16"
    mlp.get_layer("dropout").dtype_policy = "mixed_float16"
    plan = PrecisionPlan.from_model(mlp)
    assert plan.layers["dense_1"] == "bfloat16"
    assert plan.layers["dense"] == "float32"
    assert dict(plan.followers) == {"dropout": "dense"}
    assert plan.dtype_for("dropout") == "float32"  # as apply_plan sets it: like its source


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
