"""PlanDiff: what two plans assign differently (autoprec/plan/diff.py)."""

from __future__ import annotations

from conftest import build_mlp

from autoprec import PrecisionPlan


def test_diff_lists_changes():
    first = PrecisionPlan.uniform(build_mlp(), "float32")
    second = first.with_dtype("dense_1", "bfloat16")
    diff = first.diff(second)
    assert diff.changed == (("dense_1", "float32", "bfloat16"),)
    assert "dense_1" in str(diff)
    assert not first.diff(first)
    assert str(first.diff(first)) == "plans are identical"
