"""Tests for searching one study from several processes on a real PostgreSQL server.

The server is started by the session fixture of `tests/pg_server.py`; each test has
a database of its own. Threads with a storage (a connection pool) each stand for
processes where a race is the point; the `slow` tests run whole search processes
(`bench/search_worker.py`), kill one with SIGKILL, and read the study afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import optuna
import pytest
from pg_server import postgres_server  # noqa: F401  (the session fixture `postgres`)

from autoprec.search import TrialRecord, resolve_storage
from autoprec.search.result import write_record
from autoprec.search.study import (
    WarmStart,
    claim_study_lock,
    enqueue_warm_starts,
    plan_file_trial,
    release_study_lock,
    wait_for_same_assignment,
)

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "bench" / "search_worker.py"
STATES = optuna.trial.TrialState


def _record(trial) -> TrialRecord:
    return TrialRecord.from_trial(trial)


def _in_threads(count: int, work) -> list:
    """Runs `work(index)` in `count` threads released at once; returns their results in order."""
    barrier = threading.Barrier(count)
    results: list = [None] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait()
            results[index] = work(index)
        except BaseException as error:  # re-raised below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return results


def test_resolve_storage_opens_postgres_with_a_heartbeat_and_retries(postgres):
    url = postgres.create_database("opened")
    storage = resolve_storage(url)
    assert isinstance(storage, optuna.storages.RDBStorage)
    assert (storage.heartbeat_interval, storage.grace_period) == (60, 120)
    assert isinstance(
        storage.heartbeat_stale_trial_callback, optuna.storages.RetryHeartbeatStaleTrialCallback
    )
    quiet = resolve_storage(url, heartbeat_interval=None)
    assert quiet.heartbeat_interval is None


def test_processes_opening_a_new_database_at_once_all_get_its_tables(postgres):
    url = postgres.create_database("fresh")
    storages = _in_threads(4, lambda index: resolve_storage(url))
    study = optuna.create_study(storage=storages[0], study_name="s")
    assert [s.get_study_id_from_name("s") for s in storages] == [study._study_id] * 4


def test_exactly_one_of_racing_processes_takes_the_study_lock(postgres):
    url = postgres.create_database("lock")
    optuna.create_study(storage=resolve_storage(url), study_name="s")
    studies = [optuna.load_study(study_name="s", storage=resolve_storage(url)) for _ in range(6)]
    locks = _in_threads(6, lambda index: claim_study_lock(studies[index], "warm-starts"))
    winners = [lock for lock in locks if lock is not None]
    assert winners == ["s:autoprec-warm-starts"]
    assert claim_study_lock(studies[0], "warm-starts") is None  # still held
    release_study_lock(studies[0], winners[0])
    assert optuna.get_all_study_names(resolve_storage(url)) == ["s"]
    assert claim_study_lock(studies[1], "warm-starts") is not None  # free again


def test_warm_starts_are_enqueued_once_when_processes_race(postgres):
    url = postgres.create_database("warm")
    optuna.create_study(storage=resolve_storage(url), study_name="s")
    warm = [
        WarmStart(label, {"dense": dtype, "head": "float32"}, {"dense": dtype})
        for label, dtype in (("float32", "float32"), ("uniform bfloat16", "bfloat16"))
    ]
    studies = [optuna.load_study(study_name="s", storage=resolve_storage(url)) for _ in range(4)]
    added = _in_threads(4, lambda index: enqueue_warm_starts(studies[index], warm))
    assert sorted(added) == [0, 0, 0, 2]
    study = optuna.load_study(study_name="s", storage=resolve_storage(url))
    assert [_record(t).warm_start for t in study.trials] == ["float32", "uniform bfloat16"]
    assert study.user_attrs["warm_starts_enqueued"] is True
    assert enqueue_warm_starts(study, warm) == 0  # a process resuming it later
    assert len(study.trials) == 2


def test_a_trial_waits_for_the_running_trial_of_its_assignment_and_reuses_its_outcome(postgres):
    url = postgres.create_database("same")
    storage = resolve_storage(url, heartbeat_interval=None)  # trials asked, not optimized
    study = optuna.create_study(storage=storage, study_name="s")
    first, second = study.ask(), study.ask()
    for trial in (first, second):
        write_record(trial, TrialRecord(assignment_key="k", train_steps=2))
    write_record(first, TrialRecord(evaluating=first.number))
    other = optuna.load_study(study_name="s", storage=resolve_storage(url, heartbeat_interval=None))

    def finish_first() -> None:
        time.sleep(1.0)
        write_record(first, TrialRecord(metrics={"val_accuracy": 0.75}))
        study.tell(first, 1.0)

    finisher = threading.Thread(target=finish_first)
    started = time.monotonic()
    finisher.start()
    outcome = wait_for_same_assignment(other, second.number, "k", 2)
    finisher.join()
    assert time.monotonic() - started >= 0.9
    assert outcome.reused_from == first.number and outcome.metrics == {"val_accuracy": 0.75}
    # the lower-numbered trial never waits for a higher one that is not evaluating yet
    third, fourth = study.ask(), study.ask()
    for trial in (third, fourth):
        write_record(trial, TrialRecord(assignment_key="j", train_steps=2))
    assert wait_for_same_assignment(other, third.number, "j", 2, timeout=5) is None
    # and a trial whose evaluator failed evaluates the assignment itself
    write_record(third, TrialRecord(evaluating=third.number))
    study.tell(third, state=STATES.FAIL)
    assert wait_for_same_assignment(other, fourth.number, "j", 2, timeout=5) is None


_SLEEPER = textwrap.dedent(
    """
    import sys, time
    import optuna

    # a plain Optuna process (no TensorFlow to import) whose trials record a heartbeat
    storage = optuna.storages.RDBStorage(sys.argv[1], heartbeat_interval=1)
    study = optuna.load_study(study_name="s", storage=storage)

    def objective(trial):
        trial.suggest_categorical("dense", ["float32", "bfloat16"])
        trial.set_user_attr("assignment_key", "k")
        print("running", flush=True)
        time.sleep(600)

    study.optimize(objective, n_trials=1)
    """
)


def test_a_trial_of_a_killed_process_is_failed_and_enqueued_again_with_its_assignment(
    postgres, tmp_path
):
    url = postgres.create_database("killed")
    storage = resolve_storage(url, heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(storage=storage, study_name="s")
    record = TrialRecord(assignment={"dense": "bfloat16"})
    study.enqueue_trial({"dense": "bfloat16"}, user_attrs=record.to_user_attrs())
    script = tmp_path / "sleeper.py"
    script.write_text(_SLEEPER)
    process = subprocess.Popen(
        [sys.executable, str(script), url], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert process.stdout.readline().strip() == "running"
    finally:
        process.kill()
        process.wait()
    time.sleep(3)  # past the grace period
    _fail_stale_trials(study)
    killed, retried = study.get_trials()
    assert killed.state == STATES.FAIL
    assert retried.state == STATES.WAITING and retried.system_attrs["failed_trial"] == 0
    assert retried.params == {"dense": "bfloat16"}
    assert _record(retried).assignment == {"dense": "bfloat16"}
    _fail_stale_trials(study)  # another process looking again adds nothing
    assert len(study.trials) == 2


def _fail_stale_trials(study: optuna.Study) -> None:
    """What every process of the study does before it starts a trial."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def _worker(url: str, n_trials: int, seed: int, *options: str) -> subprocess.Popen:
    command = [
        sys.executable, str(WORKER), url, str(n_trials), "--study-name", "shared",
        "--seed", str(seed), "--dtypes", "float32,bfloat16", "--train-steps", "2",
        "--confirm-steps", "0", "--heartbeat-interval", "1", "--grace-period", "2", *options,
    ]  # fmt: skip
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def _finish(process: subprocess.Popen) -> None:
    _, stderr = process.communicate(timeout=400)
    assert process.returncode == 0, stderr[-3000:]


def _assert_trained_once(trials: list[optuna.trial.FrozenTrial]) -> None:
    trained = [
        _record(t).assignment_key
        for t in trials
        if t.state == STATES.COMPLETE and _record(t).reused_from is None
    ]
    assert len(trained) == len(set(trained)), trained


def _best_feasible_number(trials: list[optuna.trial.FrozenTrial]) -> int:
    feasible = [
        t
        for t in trials
        if t.state == STATES.COMPLETE and all(v <= 0 for v in t.constraints.values())
    ]
    return min(feasible, key=lambda t: (t.value, t.number)).number


@pytest.mark.slow
def test_two_workers_finish_one_study_and_leave_the_best_plan(postgres, tmp_path):
    url = postgres.create_database("workers")
    plan_path = tmp_path / "plan.json"
    workers = [_worker(url, 3, seed, "--plan-path", str(plan_path)) for seed in (1, 2)]
    torn: list[str] = []
    while any(worker.poll() is None for worker in workers):
        if plan_path.exists():
            text = plan_path.read_text()
            try:
                json.loads(text)
            except ValueError:
                torn.append(text)
        time.sleep(0.05)
    for worker in workers:
        _finish(worker)
    study = optuna.load_study(study_name="shared", storage=resolve_storage(url))
    trials = study.trials
    assert not torn
    assert sum(t.state in (STATES.COMPLETE, STATES.PRUNED) for t in trials) == 6
    assert not [t for t in trials if t.state == STATES.RUNNING]
    labels = [_record(t).warm_start for t in trials if _record(t).warm_start]
    assert "float32" in labels and len(labels) == len(set(labels))
    _assert_trained_once(trials)
    assert plan_file_trial(plan_path, "shared") == _best_feasible_number(trials)


@pytest.mark.slow
def test_a_worker_killed_mid_trial_loses_nothing_and_the_next_one_retries_its_trial(postgres):
    url = postgres.create_database("kill")
    first = _worker(url, 50, 1)
    storage = resolve_storage(url, heartbeat_interval=None)
    deadline = time.monotonic() + 300
    running = None
    while running is None and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.1)
        try:
            trials = optuna.load_study(study_name="shared", storage=storage).trials
        except KeyError:  # no study yet
            continue
        if any(t.state.is_finished() for t in trials):
            running = next((t for t in trials if t.state == STATES.RUNNING), None)
    assert running is not None, "the first worker never ran a trial"
    first.kill()
    first.wait()
    before = {
        t.number: (t.state, t.value)
        for t in optuna.load_study(study_name="shared", storage=storage).trials
        if t.state.is_finished()
    }
    _finish(_worker(url, 4, 2))
    trials = optuna.load_study(study_name="shared", storage=storage).trials
    by_number = {t.number: t for t in trials}
    assert all((by_number[n].state, by_number[n].value) == kept for n, kept in before.items())
    killed = [t for t in trials if t.number not in before and t.state == STATES.FAIL]
    assert [t.number for t in killed] == [running.number]
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == running.number]
    assert len(retries) == 1 and retries[0].state in (STATES.COMPLETE, STATES.PRUNED)
    assert not [t for t in trials if t.state == STATES.RUNNING]
    finished = [t for t in trials if t.state in (STATES.COMPLETE, STATES.PRUNED)]
    assert len(finished) == sum(s != STATES.FAIL for s, _ in before.values()) + 4
    _assert_trained_once(trials)
