"""Tests for `autoprec.search.result`: the Pareto front, the report text and the optional plot."""

from __future__ import annotations

import dataclasses

import optuna
import pytest

from autoprec.plan import PrecisionPlan
from autoprec.search import Budget, ParetoPoint, SearchResult


def _result(model) -> SearchResult:
    counts = {"float32": 1, "bfloat16": 2, "float16": 0}
    points = [
        ParetoPoint(trial=0, predicted_seconds=4e-3, metric=0.90, feasible=True, counts=counts),
        ParetoPoint(trial=1, predicted_seconds=2e-3, metric=0.88, feasible=True, counts=counts),
        ParetoPoint(trial=2, predicted_seconds=3e-3, metric=0.80, feasible=False, counts=counts),
        ParetoPoint(
            trial=3, predicted_seconds=1e-3, metric=float("nan"), feasible=False, counts={}
        ),
    ]
    plan = PrecisionPlan.uniform(model, "bfloat16").with_metadata(
        measured_metric=0.88, predicted_speedup=2.0, measured_speedup=None
    )
    return SearchResult(
        plan=plan,
        study=optuna.create_study(),
        budget=Budget("val_accuracy", max_drop=0.05),
        reference_metric=0.9,
        reference_spread=0.01,
        points=points,
        float32_predicted_seconds=4e-3,
    )


def test_pareto_front_is_fastest_first_and_drops_dominated_and_non_finite_points(mlp):
    result = _result(mlp)
    assert [point.trial for point in result.pareto] == [1, 0]


def test_report_lists_the_front_and_the_chosen_plan(mlp):
    text = _result(mlp).report()
    lines = text.splitlines()
    assert lines[0].startswith("autoprec search: 0 trial(s), budget val_accuracy >= 0.85")
    assert "± 0.01" in lines[0]
    assert lines[2].split()[:3] == ["1", "2.000ms", "2.00x"]
    assert "2 bf16 / 1 f32 / 0 f16" in lines[2]
    assert lines[-1].startswith("chosen: ")
    assert "predicted speedup 2, measured speedup n/a" in lines[-1]


def test_report_saves_a_plot(mlp, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "pareto.png"
    text = _result(mlp).report(plot_path=path)
    assert text.splitlines()[-1] == f"plot: {path}"
    assert path.stat().st_size > 0


def test_result_is_frozen(mlp):
    with pytest.raises(dataclasses.FrozenInstanceError):
        _result(mlp).reference_metric = 0.0


def test_report_lists_the_warm_starts_beside_the_chosen_plan(mlp):
    result = _result(mlp)
    counts = {"float32": 3, "bfloat16": 0, "float16": 0}
    labelled = [
        ParetoPoint(0, 4e-3, 0.90, True, counts, label="float32"),
        ParetoPoint(1, 2e-3, 0.89, True, {"bfloat16": 3}, label="uniform bfloat16"),
    ]
    text = dataclasses.replace(result, points=[*result.points, *labelled]).report()
    lines = text.splitlines()
    start = lines.index("finalists (warm starts and plans added after the trials, ungrouped):")
    assert "float32: 0 bf16 / 3 f32 / 0 f16" in lines[start + 1]
    assert "uniform bfloat16: 3 bf16 / 0 f32 / 0 f16" in lines[start + 2]
    assert lines[start + 3].startswith("chosen: ") and lines[-1] == lines[start + 3]


def _measured(model, measurement, points):
    result = _result(model)
    plan = result.plan.with_metadata(
        search={"measurement": measurement, "measured_step_seconds": {"float32": 4e-3}}
    )
    return dataclasses.replace(result, plan=plan, points=[*result.points, *points]).report()


def test_report_says_which_plan_the_measured_step_chose_and_by_how_much(mlp):
    counts = {"bfloat16": 3}
    points = [
        ParetoPoint(0, 4e-3, 0.90, True, {"float32": 3}, label="float32"),
        ParetoPoint(4, 2e-3, 0.89, True, counts, label="keras mixed_bfloat16"),
    ]
    separated = {
        "verdict": "separated",
        "leader": "keras mixed_bfloat16",
        "contenders": ["keras mixed_bfloat16"],
        "median_seconds": {"float32": 4.0e-3, "keras mixed_bfloat16": 2.5e-3},
        "rounds_timed": {"float32": 5, "keras mixed_bfloat16": 5},
    }
    lines = _measured(mlp, separated, points).splitlines()
    assert "keras mixed_bfloat16: 3 bf16 / 0 f32 / 0 f16; measured 2.500 ms median" in lines[-3]
    assert lines[-2] == (
        "measured: 5 interleaved round(s) of 2 plan(s); keras mixed_bfloat16 at 2.5 ms median "
        "(1.6x float32), ahead of every other plan beyond the noise"
    )
    tie = {
        **separated,
        "verdict": "tie",
        "leader": "float32",
        "contenders": ["keras mixed_bfloat16", "float32"],
        "rounds_timed": {"float32": 15, "keras mixed_bfloat16": 15},
    }
    line = _measured(mlp, tie, points).splitlines()[-2]
    assert line == (
        "measured: 15 interleaved round(s) of 2 plan(s); a tie within the noise "
        "(keras mixed_bfloat16, float32): the simpler float32 at 4 ms median"
    )
