"""Tests for `report_lines`: the report printed once the automatic plan is applied."""

from __future__ import annotations

import keras

from autoprec import PrecisionPlan
from autoprec.decision import report_lines


def _plan(evidence: dict) -> PrecisionPlan:
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(4, name="hidden"),
            keras.layers.Dense(2, name="head"),
        ]
    )
    return PrecisionPlan.uniform(model, "float32").with_metadata(
        hardware="rtx4090", evidence=evidence
    )


def test_the_report_counts_dtypes_and_says_why_each_float32_layer_stayed():
    plan = _plan(
        {
            "head": {"reason": "model output: kept float32 for the loss"},
            "hidden": {"removed": {"float16": "overflows"}},
        }
    )
    lines = report_lines(plan, None, {"hidden": "float32", "head": "float32"})
    assert lines == [
        "autoprec: automatic plan: 2 float32 layer(s) on rtx4090",
        "  float32 head: model output: kept float32 for the loss",
        "  float32 hidden: float16 ruled out: overflows",
    ]
    # A layer that computes in 16 bits is not listed, whatever its evidence.
    lines = report_lines(plan, None, {"hidden": "bfloat16", "head": "float32"})
    assert lines[0] == "autoprec: automatic plan: 1 float32, 1 bfloat16 layer(s) on rtx4090"
    assert len(lines) == 2


def test_the_report_lists_at_most_eight_float32_layers():
    evidence = {f"layer_{index}": {"profile": "overflows float16"} for index in range(10)}
    lines = report_lines(_plan(evidence), None, {path: "float32" for path in evidence})
    assert lines[1] == "  float32 layer_0: float16 unsafe: overflows float16"
    assert len(lines) == 1 + 8 + 1
    assert lines[-1] == "  ... and 2 more; see plan.metadata['evidence']"
