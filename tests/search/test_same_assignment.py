"""Tests for `autoprec.search.same_assignment`: one assignment trained once in a study."""

from __future__ import annotations

import threading
import time

import optuna

from autoprec.search import TrialRecord
from autoprec.search.record import write_record
from autoprec.search.storage import trained_outcome, wait_for_same_assignment


def _tell(study, key, steps, record):
    trial = study.ask()
    write_record(trial, TrialRecord(assignment_key=key, train_steps=steps))
    write_record(trial, record)
    study.tell(trial, 1.0)


def test_the_outcome_of_a_completed_trial_of_the_same_assignment_and_fidelity_is_found():
    study = optuna.create_study()
    _tell(study, "k", 4, TrialRecord(metrics={"accuracy": 0.5}))
    _tell(study, "k", 4, TrialRecord(metrics={"accuracy": 0.5}, reused=True, reused_from=0))
    _tell(study, "k", 8, TrialRecord(metrics={"accuracy": 0.7}))
    assert trained_outcome(study, "k", 4).trial == 0
    assert trained_outcome(study, "k", 8).metrics == {"accuracy": 0.7}
    assert trained_outcome(study, "k", 2) is None and trained_outcome(study, "j", 4) is None


def test_a_trial_waits_for_the_one_evaluating_its_assignment_and_reuses_its_outcome():
    study = optuna.create_study()
    first, second = study.ask(), study.ask()
    for trial in (first, second):
        write_record(trial, TrialRecord(assignment_key="k", train_steps=2))
    write_record(first, TrialRecord(evaluating=first.number))

    def finish_first() -> None:
        time.sleep(0.6)
        write_record(first, TrialRecord(metrics={"accuracy": 0.75}))
        study.tell(first, 1.0)

    finisher = threading.Thread(target=finish_first)
    started = time.monotonic()
    finisher.start()
    outcome = wait_for_same_assignment(study, second.number, "k", 2, timeout=30)
    finisher.join()
    assert time.monotonic() - started >= 0.5
    assert outcome.trial == first.number and outcome.metrics == {"accuracy": 0.75}


def test_no_trial_waits_for_a_higher_one_that_is_not_evaluating_and_waits_end():
    study = optuna.create_study()
    lower, higher = study.ask(), study.ask()
    for trial in (lower, higher):
        write_record(trial, TrialRecord(assignment_key="j", train_steps=2))
    assert wait_for_same_assignment(study, lower.number, "j", 2, timeout=5) is None
    started = time.monotonic()  # the higher trial waits for the lower one, up to its timeout
    assert wait_for_same_assignment(study, higher.number, "j", 2, timeout=0.6) is None
    assert time.monotonic() - started >= 0.6
