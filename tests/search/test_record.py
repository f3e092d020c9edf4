"""Tests for `autoprec.search.record`: the trial record round trips through a real study's user attrs."""

from __future__ import annotations

import math

import optuna
import pytest

from autoprec.search.record import (
    ASSIGNMENT_ATTR,
    METRIC_ATTR,
    REUSED_ATTR,
    WARM_START_ATTR,
    TrialRecord,
    assignment_key,
    json_safe,
    stored_outcome,
    write_record,
)
from autoprec.search.storage import resolve_storage

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
    assert attrs == {ASSIGNMENT_ATTR: {"dense": "float32"}, WARM_START_ATTR: "float32"}
    study.enqueue_trial({}, user_attrs=attrs)
    study.optimize(lambda trial: 0.0, n_trials=1)
    stored = TrialRecord.from_trial(study.trials[0])
    assert stored == record and stored.label == "float32" and not stored.reused
    assert REUSED_ATTR not in study.trials[0].user_attrs


def test_none_is_written_only_where_asked_and_unknown_fields_are_refused():
    assert METRIC_ATTR not in TrialRecord(metric=None).to_user_attrs()
    assert TrialRecord(metric=None).to_user_attrs(with_none=["metric"]) == {METRIC_ATTR: None}
    with pytest.raises(ValueError, match="'metrc'"):
        TrialRecord().to_user_attrs(with_none=["metrc"])


def test_stored_outcome_reads_what_a_trial_trained_and_not_what_it_reused():
    study = optuna.create_study()
    trained = TrialRecord(metrics={"loss": None, "accuracy": 0.5}, proxy_score=0.1)
    reused = TrialRecord(metrics={"accuracy": 0.5}, reused=True, reused_from=0)
    for record in (trained, reused, TrialRecord(assignment_key="k")):
        study.enqueue_trial({}, user_attrs=record.to_user_attrs())
    study.optimize(lambda trial: 0.0, n_trials=3)
    first, second, third = study.trials
    outcome = stored_outcome(first)
    assert outcome.trial == 0 and outcome.proxy_score == 0.1
    assert outcome.metrics["accuracy"] == 0.5 and math.isnan(outcome.metrics["loss"])
    assert stored_outcome(second) is None and stored_outcome(third) is None
    assert TrialRecord.from_trial(second).label is None


def test_assignment_keys_are_stable_and_order_free():
    key = assignment_key({"a": "float32", "b": "bfloat16"})
    assert key == assignment_key({"b": "bfloat16", "a": "float32"}) and len(key) == 20
    assert key != assignment_key({"a": "bfloat16", "b": "bfloat16"})
    assert json_safe(float("nan")) is None and json_safe(1.5) == 1.5 and json_safe("x") == "x"
