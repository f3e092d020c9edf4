"""Optuna storages shared by processes: resolving one, study locks, and waiting for a trial another process trains."""

from __future__ import annotations

import logging
import os
import time
import warnings

import optuna
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend

from ..errors import AutoprecError
from .record import TrainedOutcome, TrialRecord, stored_outcome

#: Database storages: seconds between two heartbeats of a running trial.
HEARTBEAT_INTERVAL_SECONDS = 60
#: Times a trial whose process died (stale heartbeat) is enqueued again.
_STALE_TRIAL_RETRIES = 2
#: Attempts at opening a database whose tables another process is creating at the same time.
_SCHEMA_ATTEMPTS = 5


def resolve_storage(
    storage: str | os.PathLike | optuna.storages.BaseStorage | None,
    *,
    heartbeat_interval: int | None = HEARTBEAT_INTERVAL_SECONDS,
    grace_period: int | None = None,
) -> optuna.storages.BaseStorage | None:
    """Returns the Optuna storage for a `storage=` argument: journal files and database URLs opened."""
    if storage is None or not isinstance(storage, (str, os.PathLike)):
        return storage
    text = os.fspath(storage)
    if text.startswith("journal://"):
        text = text[len("journal://") :]
        if text.startswith("/") and text.startswith("//"):
            text = text[1:]
    elif not text.endswith(".log"):
        return _database_storage(text, heartbeat_interval, grace_period)
    return JournalStorage(JournalFileBackend(text))


def _database_storage(
    url: str, heartbeat_interval: int | None, grace_period: int | None
) -> RDBStorage:
    import sqlalchemy.exc

    for attempt in range(_SCHEMA_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                if heartbeat_interval is None:
                    return RDBStorage(url)
                return RDBStorage(
                    url,
                    heartbeat_interval=int(heartbeat_interval),
                    grace_period=int(grace_period or 2 * heartbeat_interval),
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(
                        max_retry=_STALE_TRIAL_RETRIES
                    ),
                )
        except ImportError as error:
            driver = "psycopg[binary]" if url.startswith("postgresql") else "the database driver"
            raise AutoprecError(
                f"storage {_safe_url(url)!r}: {error.__cause__ or error}. Install {driver} "
                "(pip install ...) in this environment, or use a journal file (search.log)."
            ) from error
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            if attempt == _SCHEMA_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * (attempt + 1))  # another process is creating the tables
    raise AssertionError("unreachable")


def _safe_url(url: str) -> str:
    """Returns a database URL with its password left out, for messages."""
    scheme, separator, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not separator or not at:
        return url
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


def claim_study_lock(study: optuna.Study, what: str) -> str | None:
    """Takes a lock shared by every process of a study: creates the study
    `"<name>:autoprec-<what>"`."""
    name = f"{study.study_name}:autoprec-{what}"
    try:
        study._storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], name)
    except optuna.exceptions.DuplicatedStudyError:
        return None
    return name


def release_study_lock(study: optuna.Study, name: str) -> None:
    """Releases a lock taken by `claim_study_lock` (deletes its study)."""
    storage = study._storage
    try:
        storage.delete_study(storage.get_study_id_from_name(name))
    except KeyError:
        pass


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
