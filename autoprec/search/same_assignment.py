"""One assignment, trained once: the outcome a trial of the study stored, or the wait for one."""

from __future__ import annotations

import logging
import time
import warnings

import optuna

from .record import TrainedOutcome, TrialRecord, stored_outcome

logger = logging.getLogger("autoprec")

#: Seconds between two looks at the storage while another trial evaluates the same assignment.
_POLL_SECONDS = 0.5
#: A trial waits at least this long (and 3 x the longest trial) for another one evaluating
#: its assignment, then evaluates it too (the other's process may have died unseen).
_MIN_WAIT_SECONDS = 120.0


def trained_outcome(study: optuna.Study, key: str, train_steps: int) -> TrainedOutcome | None:
    """Returns the outcome of a completed trial of the study that trained the same assignment."""
    for other in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        record = TrialRecord.from_trial(other)
        if record.assignment_key != key or record.train_steps != train_steps:
            continue
        outcome = stored_outcome(other)
        if outcome is not None:
            return outcome
    return None


def wait_for_same_assignment(
    study: optuna.Study,
    trial_number: int,
    key: str,
    train_steps: int,
    *,
    timeout: float | None = None,
) -> TrainedOutcome | None:
    """Waits while another running trial evaluates the same assignment; returns its outcome."""
    deadline = None
    while True:
        stored = trained_outcome(study, key, train_steps)
        if stored is not None:
            return stored
        others = _evaluating_same(study, trial_number, key, train_steps)
        if not others:
            return None
        if deadline is None:
            limit = timeout if timeout is not None else _longest_wait(study)
            deadline = time.monotonic() + limit
            logger.info(
                "autoprec.search: trial %d waits for trial %d, which evaluates the same plan.",
                trial_number,
                others[0],
            )
        elif time.monotonic() > deadline:
            logger.info(
                "autoprec.search: trial %d stops waiting for trial %d and evaluates the plan.",
                trial_number,
                others[0],
            )
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        time.sleep(_POLL_SECONDS)


def _evaluating_same(
    study: optuna.Study, trial_number: int, key: str, train_steps: int
) -> list[int]:
    """Returns the numbers of the running trials this trial waits for."""
    numbers = []
    for other in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        record = TrialRecord.from_trial(other)
        if (
            other.number != trial_number
            and record.assignment_key == key
            and record.train_steps == train_steps
            and (record.evaluating == other.number or other.number < trial_number)
        ):
            numbers.append(other.number)
    return numbers


def _longest_wait(study: optuna.Study) -> float:
    durations = [
        trial.duration.total_seconds()
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if trial.duration is not None
    ]
    return max(_MIN_WAIT_SECONDS, 3.0 * max(durations, default=0.0))
