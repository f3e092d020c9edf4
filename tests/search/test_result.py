"""Tests for `autoprec.search.result`: trial records in a real study, the Pareto front, the report."""

from __future__ import annotations

import dataclasses
import math

import optuna
import pytest

from autoprec.plan import PrecisionPlan
from autoprec.search import Budget, ParetoPoint, SearchResult
from autoprec.search.budget import json_safe
from autoprec.search.result import (
    TrialRecord,
    assignment_key,
    write_record,
)
from autoprec.search.study import resolve_storage, trained_outcome


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


FULL = TrialRecord(
    assignment={"dense": "bfloat16", "head": "float32"},
    assignment_key=assignment_key({"dense": "bfloat16", "head": "float32"}),
    train_steps=4,
    warm_start="uniform bfloat16",
    evaluating=0,
    dtype_counts={"bfloat16": 1, "float32": 1},
    predicted_seconds=1.5e-3,
    activation_bytes_per_sample=2048.0,
    fidelity=("profile", "proxy", "train"),
    proxy={"loss_relative_error": 0.01, "gradient_cosine": 0.99, "finite": True},
    proxy_score=0.02,
    metrics={"accuracy": 0.75, "loss": None},
    metric=0.75,
    budget_violation=-0.1,
)


@pytest.mark.parametrize("kind", ["memory", "journal"])
def test_a_record_written_on_a_running_trial_reads_back_equal(tmp_path, kind):
    storage = resolve_storage(tmp_path / "r.log") if kind == "journal" else None
    study = optuna.create_study(storage=storage, study_name="r")
    trial = study.ask()
    write_record(trial, TrialRecord(assignment=FULL.assignment, train_steps=4))
    assert TrialRecord.from_trial(trial).train_steps == 4  # a running trial reads too
    fields = {name: getattr(FULL, name) for name in ("assignment_key", "fidelity", "metric")}
    write_record(trial, TrialRecord(**fields))
    study.tell(trial, 1.0)
    stored = TrialRecord.from_trial(study.trials[0])
    assert stored.assignment == FULL.assignment  # the first write stays
    assert (stored.train_steps, stored.metric, stored.fidelity) == (4, 0.75, FULL.fidelity)
    whole = study.ask()
    write_record(whole, FULL)
    study.tell(whole, 2.0)
    assert TrialRecord.from_trial(study.trials[1]) == FULL


def test_enqueued_records_reach_the_trial_and_unset_fields_are_not_written():
    study = optuna.create_study()
    record = TrialRecord(warm_start="float32", assignment={"dense": "float32"})
    attrs = record.to_user_attrs()
    assert attrs == {"assignment": {"dense": "float32"}, "warm_start": "float32"}
    study.enqueue_trial({}, user_attrs=attrs)
    study.optimize(lambda trial: 0.0, n_trials=1)
    stored = TrialRecord.from_trial(study.trials[0])
    assert stored == record and stored.label == "float32" and not stored.reused
    assert "reused" not in study.trials[0].user_attrs


def test_none_is_written_only_where_asked_and_unknown_fields_are_refused():
    assert "metric" not in TrialRecord(metric=None).to_user_attrs()
    assert TrialRecord(metric=None).to_user_attrs(with_none=["metric"]) == {"metric": None}
    with pytest.raises(ValueError, match="'metrc'"):
        TrialRecord().to_user_attrs(with_none=["metrc"])


def test_a_trained_outcome_is_what_a_trial_trained_and_not_what_it_reused():
    study = optuna.create_study()
    reused = TrialRecord(assignment_key="k", train_steps=4, metrics={"accuracy": 0.5}, reused=True)
    trained = TrialRecord(
        assignment_key="k", train_steps=4, metrics={"loss": None, "accuracy": 0.5}, proxy_score=0.1
    )
    for record in (dataclasses.replace(reused, reused_from=1), trained):
        study.enqueue_trial({}, user_attrs=record.to_user_attrs())
    study.optimize(lambda trial: 0.0, n_trials=2)
    outcome = trained_outcome(study, "k", 4)
    assert outcome.reused_from == 1 and outcome.proxy_score == 0.1
    assert outcome.metrics["accuracy"] == 0.5 and math.isnan(outcome.metrics["loss"])
    assert trained_outcome(study, "k", 8) is None
    assert TrialRecord.from_trial(study.trials[0]).label is None


def test_assignment_keys_are_stable_and_order_free():
    key = assignment_key({"a": "float32", "b": "bfloat16"})
    assert key == assignment_key({"b": "bfloat16", "a": "float32"}) and len(key) == 20
    assert key != assignment_key({"a": "bfloat16", "b": "bfloat16"})
    assert json_safe(float("nan")) is None and json_safe(1.5) == 1.5 and json_safe("x") == "x"
