"""Plan JSON: round trips, errors naming file and field, the shipped schema (autoprec/plan/serialize.py)."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import pytest
from conftest import build_cnn
from reload_checks import PrefixedBackbone

import autoprec
from autoprec import PlanError, PrecisionPlan
from autoprec.layers import describe_model, model_fingerprint
from autoprec.plan import FORMAT_VERSION
from autoprec.plan.serialize import FORMAT_NAME


def test_json_round_trip_keeps_everything(attention_model, tmp_path):
    plan = (
        PrecisionPlan.uniform(attention_model, "bfloat16")
        .with_dtype("dense", "float32")
        .with_rule(class_name="Softmax", dtype="float32")
        .with_metadata(hardware="rtx4090", measured_metric=0.9, evidence={"dense": {"why": "head"}})
        .with_event({"step": 3, "layer": "dense", "from": "float16", "to": "float32"})
    )
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = PrecisionPlan.load(path)
    assert loaded == plan
    assert loaded.to_dict() == plan.to_dict()
    assert loaded.metadata["evidence"] == {"dense": {"why": "head"}}
    assert loaded.events[0]["layer"] == "dense"
    assert PrecisionPlan.from_json(plan.to_json()) == plan
    assert not list(tmp_path.glob(".*tmp"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", r"not valid JSON at line 1"),
        ("", r"empty \(truncated write\?\)"),
        ('{"format_version": 1, "layers": {"dense": "float64"}}', r"layers\['dense'\].*float64"),
        ('{"format_version": 99}', r"format_version 99 is newer.*upgrade"),
        ('{"layers": {}}', r"missing 'format_version'"),
        ('{"format_version": "1"}', r"'format_version' must be int"),
        ('{"format_version": 1, "layers": []}', r"field 'layers' must be dict"),
        ('{"format_version": 1, "rules": [{"dtype": "float32"}]}', r"rules\[0\].*'path'.*'class'"),
        (
            '{"format_version": 1, "layers": {"a": {"class": "Dense"}}}',
            r"layers\['a'\] has no 'dtype'",
        ),
        ('{"format_version": 1, "default": 16}', r"default.*unknown dtype 16"),
        ("[1, 2]", r"must be dict"),
    ],
)
def test_bad_plan_files_raise_clear_errors_naming_file_and_field(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(PlanError, match=message) as error:
        PrecisionPlan.load(path)
    assert str(path) in str(error.value)


def test_truncated_plan_file_is_refused(tmp_path, mlp):
    path = tmp_path / "plan.json"
    PrecisionPlan.uniform(mlp, "bfloat16").save(path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(PlanError, match="not valid JSON"):
        PrecisionPlan.load(path)


def test_missing_file_is_a_plan_error(tmp_path):
    with pytest.raises(PlanError, match="no such file"):
        PrecisionPlan.load(tmp_path / "nope.json")


def test_plan_schema_ships_with_the_package():
    from importlib import resources

    schema = json.loads(
        resources.files("autoprec").joinpath("schemas/plan.schema.json").read_text()
    )
    assert schema["properties"]["format_version"]["maximum"] == FORMAT_VERSION
    assert set(schema["required"]) <= set(PrecisionPlan.uniform(build_cnn(), "float32").to_dict())


def test_files_that_list_followers_with_a_dtype_still_load(mlp, tmp_path):
    """Files from 0.2 list pass-through layers among `layers`; they load, their dtype derived."""
    old = PrecisionPlan.uniform(mlp, "bfloat16").to_dict()
    old["layers"]["dropout"]["dtype"] = "float16"  # hand-edited: disagrees with its source
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    plan = PrecisionPlan.load(path)
    assert dict(plan.layers) == {"dense": "bfloat16", "dense_1": "bfloat16", "dense_2": "bfloat16"}
    assert dict(plan.followers) == {"dropout": "dense"}
    assert plan.dtype_for("dropout") == "bfloat16"
    written = plan.to_dict()["layers"]
    assert list(written) == ["dense", "dropout", "dense_1", "dense_2"]  # every layer, model order
    assert written["dropout"] == {**old["layers"]["dropout"], "dtype": "bfloat16"}
    assert plan.with_rule(class_name="Dense", dtype="float32").layers["dense_2"] == "float32"


def test_hand_written_layers_without_classes_are_all_decisions(tmp_path):
    path = tmp_path / "hand.json"
    path.write_text('{"format_version": 1, "layers": {"dense": "bf16", "dropout": "fp16"}}')
    plan = PrecisionPlan.load(path)
    assert dict(plan.layers) == {"dense": "bfloat16", "dropout": "float16"}
    assert not plan.followers


def test_plan_to_dict_writes_every_field_of_the_format(cnn):
    plan = (
        PrecisionPlan.uniform(cnn, "float32", created="2024-05-01T00:00:00+00:00")
        .with_rule(class_name="Dense", dtype="bfloat16")
        .with_event({"step": 1, "layer": "dense"})
    )
    data = plan.to_dict()
    assert data["format"] == FORMAT_NAME and data["format_version"] == FORMAT_VERSION
    assert data["created"] == "2024-05-01T00:00:00+00:00"
    assert data["model"] == {"name": "cnn", "fingerprint": plan.fingerprint}
    assert data["default"] == "float32"
    assert data["rules"] == [{"class": "Dense", "dtype": "bfloat16"}]
    assert data["layers"]["flatten"] == {
        "dtype": "float32",
        "class": "Flatten",
        "keras_path": "cnn/flatten",
        "parameters": 0,
        "weight_shapes": [],
        "container": False,
        "pass_through": True,
        "follows": "max_pooling2d",
    }
    assert data["layers"]["dense"]["dtype"] == "bfloat16"
    assert data["layers"]["conv2d"]["weight_shapes"] == [[3, 3, 1, 4], [4]]
    assert data["events"] == [{"step": 1, "layer": "dense"}]
    assert json.loads(json.dumps(data)) == data  # JSON types only
    data["metadata"]["hardware"] = "changed"
    assert plan.metadata["hardware"] is None  # a copy
    assert PrecisionPlan.from_dict(data, "<dict>").metadata["hardware"] == "changed"


def _prefixed(backbone_name: str | None) -> keras.Model:
    inputs = keras.Input((6, 8), name="features")
    hidden = PrefixedBackbone(name=backbone_name)(inputs)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(hidden)
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(pooled), name="prefixed")


def test_paths_and_fingerprint_leave_out_a_container_name_before_its_sub_layers():
    unnamed, counted = _prefixed(None), _prefixed("prefixed_backbone_3")
    assert counted.layers[1].embed.name == "prefixed_backbone_3_embed"
    paths = list(describe_model(unnamed))
    assert paths == list(describe_model(counted))
    assert "prefixed_backbone/embed" in paths
    assert model_fingerprint(unnamed) == model_fingerprint(counted)


def test_a_0_4_plan_with_a_container_name_in_its_paths_loads_and_applies():
    """0.4 wrote `backbone/backbone_norm` where paths now say `backbone/norm`."""
    plan = PrecisionPlan.load(Path(__file__).parent / "data" / "plan_0_4_prefixed.json")
    assert "backbone/backbone_norm" in plan.layers
    model = _prefixed("backbone")
    handle = autoprec.apply_plan(model, plan)
    assert handle.dtypes["backbone/norm"] == "float16"
    assert handle.dtypes["backbone/embed"] == "bfloat16"
    assert handle.dtypes["head"] == "float32"
    assert model.get_layer("backbone").norm.compute_dtype == "float16"
    assert "backbone/backbone_norm" not in handle.plan.layers
