"""The shipped plan JSON Schema (autoprec/schemas/plan.schema.json) holds what the code writes and the docs show.

- every plan the code writes validates: uniform, from_model, with rules, with metadata and
  events, the heuristic plan, the plan a guard promotion leaves in its `plan_path` file;
- every ```json block of README.md and docs/*.md that is a plan validates and loads;
- plans the reader refuses, the schema refuses too.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import jsonschema
import keras
import numpy as np
import pytest
from conftest import build_attention_model, build_cnn, build_mlp

import autoprec
from autoprec import PlanError, PrecisionPlan

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^```json\n(.*?)^```", re.MULTILINE | re.DOTALL)
_PLAN_KEYS = {"format_version", "layers", "rules", "default"}


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(
        resources.files("autoprec").joinpath("schemas/plan.schema.json").read_text()
    )
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def assert_valid(validator, data: dict, what: str) -> None:
    errors = [
        f"{'/'.join(map(str, error.absolute_path)) or '<top level>'}: {error.message}"
        for error in validator.iter_errors(data)
    ]
    assert not errors, f"{what} does not match plan.schema.json:\n" + "\n".join(errors)


def written(plan: PrecisionPlan, tmp_path: Path) -> dict:
    """The plan as `save` writes it, read back as JSON."""
    path = tmp_path / "plan.json"
    plan.save(path)
    return json.loads(path.read_text())


@pytest.mark.parametrize("build", [build_mlp, build_cnn, build_attention_model])
def test_uniform_and_from_model_plans_match_the_schema(validator, tmp_path, build):
    model = build()
    assert_valid(validator, written(PrecisionPlan.uniform(model, "bfloat16"), tmp_path), "uniform")
    assert_valid(validator, written(PrecisionPlan.from_model(model), tmp_path), "from_model")


def test_plans_with_rules_metadata_and_events_match_the_schema(validator, tmp_path, mlp):
    plan = (
        PrecisionPlan.uniform(mlp, "float16")
        .with_dtype("dense_2", "float32")
        .with_rule(class_name="Dense", dtype="bfloat16")
        .with_rule(path="dense_2", dtype="float32")
        .with_metadata(
            hardware="rtx4090",
            budget={"metric": "val_accuracy", "max_drop": 0.01},
            reference_metric=0.9,
            predicted_speedup=1.5,
            loss_scale={"mode": "dynamic", "current": 32768.0, "floor": 1.0},
            evidence={"dense_2": {"reason": "output layer"}},
            search={"trials": 2},
        )
        .with_event({"step": 3, "layer": "dense", "from": "float16", "to": "bfloat16"})
    )
    data = written(plan, tmp_path)
    assert data["rules"] and data["events"] and data["metadata"]["evidence"]
    assert_valid(validator, data, "a plan with rules, metadata and events")


def test_heuristic_plan_matches_the_schema(validator, tmp_path, attention_model):
    plan = autoprec.heuristic_plan(attention_model, hardware="rtx4090")
    assert_valid(validator, written(plan, tmp_path), "heuristic_plan")


@pytest.mark.slow
def test_search_result_plan_matches_the_schema(validator, tmp_path, classification):
    x, y = classification
    model = build_mlp()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    dtypes = ["float32", "bfloat16"]
    if hasattr(autoprec, "SearchSettings"):
        knobs = {"settings": autoprec.SearchSettings(steps_per_trial=2, dtypes=dtypes)}
    else:
        knobs = {"train_steps": 2, "dtypes": dtypes}
    result = autoprec.search(
        model,
        (x[:96], y[:96]),
        (x[96:], y[96:]),
        budget=autoprec.Budget("val_loss", max_drop=0.5),
        hardware="rtx4090",
        n_trials=2,
        verbose=0,
        **knobs,
    )
    data = written(result.plan, tmp_path)
    assert data["metadata"]["search"]["trials"] == 2, data["metadata"]["search"]
    assert_valid(validator, data, "a search result's plan")


def test_plan_after_a_guard_promotion_matches_the_schema(validator, tmp_path):
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, name="big"), keras.layers.Dense(1, name="out")]
    )
    model.compile(optimizer=keras.optimizers.SGD(1e-12), loss="mse")
    kernel, bias = model.get_layer("big").get_weights()
    model.get_layer("big").set_weights([np.full_like(kernel, 100.0), bias])
    x = np.full((160, 4), 1000.0, "float32")  # `big` outputs ~4e5, above float16's 65504
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32")
    path = tmp_path / "trained.json"
    callback = autoprec.AutoPrecision(plan, plan_path=path, verbose=0)
    model.fit(
        x, np.zeros((160, 1), "float32"), batch_size=4, epochs=1, verbose=0, callbacks=[callback]
    )
    data = json.loads(path.read_text())
    assert any(event.get("layer") == "big" for event in data["events"]), data["events"]
    assert_valid(validator, data, "the plan saved after a guard promotion")


def plan_examples() -> list[tuple[str, dict]]:
    """`(where, plan)` for every ```json block of README.md and docs/*.md that is a plan."""
    examples = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for index, match in enumerate(_FENCE.finditer(path.read_text())):
            data = json.loads(match.group(1))
            is_plan = data.get("format") == "autoprec.plan" or (
                "format" not in data and "name" not in data and _PLAN_KEYS & set(data)
            )
            if is_plan:
                examples.append((f"{path.relative_to(ROOT)} json block {index}", data))
    return examples


def test_the_docs_show_plans():
    where = [name for name, _ in plan_examples()]
    assert len(where) >= 2 and any("plan-format.md" in name for name in where), where


@pytest.mark.parametrize(
    "where, data", plan_examples(), ids=[where for where, _ in plan_examples()]
)
def test_every_plan_the_docs_show_matches_the_schema_and_loads(validator, where, data):
    assert_valid(validator, data, where)
    PrecisionPlan.from_dict(data, where)


def test_every_dtype_the_schema_names_is_one_the_reader_accepts(validator):
    for dtype in validator.schema["$defs"]["compute_dtype"]["enum"]:
        PrecisionPlan.from_dict({"format_version": 1, "default": dtype}, "plan.json")
    for dtype in validator.schema["$defs"]["dtype"]["enum"]:
        PrecisionPlan.from_dict({"format_version": 1, "layers": {"dense": dtype}}, "plan.json")
        PrecisionPlan.from_dict(
            {"format_version": 1, "layers": {"d": {"class": "Dense", "dtype": dtype}}}, "plan.json"
        )


@pytest.mark.parametrize(
    "data",
    [
        {"default": "bfloat16"},  # no format_version
        {"format_version": 2},
        {"format_version": 1, "format": "autoprec.profile"},
        {"format_version": 1, "default": "float64"},
        {"format_version": 1, "layers": {"dense": "int8"}},
        {"format_version": 1, "layers": {"dense": {"class": "Dense"}}},  # no dtype
        {"format_version": 1, "rules": [{"class": "Softmax"}]},  # no dtype
        {"format_version": 1, "rules": [{"dtype": "float32"}]},  # neither path nor class
        {"format_version": 1, "rules": [{"class": "Softmax", "dtype": "float32", "x": 1}]},
        {"format_version": 1, "layers": []},
        {"format_version": 1, "events": [3]},
        {"format_version": 1, "default": "float8"},  # float8 only for Dense/EinsumDense
        {"format_version": 1, "metadata": {"float8_source": "float8"}},
    ],
    ids=lambda data: json.dumps(data)[:48],
)
def test_plans_the_reader_refuses_the_schema_refuses(validator, data):
    with pytest.raises(PlanError):
        PrecisionPlan.from_dict(data, "plan.json")
    assert list(validator.iter_errors(data)), f"the schema accepts {data}, the reader refuses it"
