"""Tests for `autoprec.search.study`: storages, resume, interruption, processes sharing a study."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import keras
import optuna
import pytest
from search.search_models import compiled_mlp, fast, mlp_data

import autoprec
from autoprec.search import Budget, TrialRecord, resolve_storage, search
from autoprec.search.record import WARM_STARTS_MARK
from autoprec.search.study import plan_file_trial

WORKER = Path(__file__).resolve().parents[2] / "bench" / "search_worker.py"


def _search(budget, n_trials, storage, study_name, **options):
    """Searches the compiled MLP on its data (the one call of `search` in this file)."""
    train, val = mlp_data()
    keras.utils.set_random_seed(0)
    return search(
        compiled_mlp(), train, val, budget=budget, n_trials=n_trials, storage=storage,
        study_name=study_name, **fast(**options),
    )  # fmt: skip


def test_resume_accumulates_without_duplicate_warm_starts(tmp_path):
    storage = str(tmp_path / "study.log")
    for _ in range(2):
        _search(Budget("val_accuracy", max_drop=0.2), 3, storage, "s")
    study = optuna.load_study(study_name="s", storage=resolve_storage(storage))
    assert len(study.trials) == 6
    labels = [r.warm_start for r in map(TrialRecord.from_trial, study.trials) if r.warm_start]
    assert len(labels) == len(set(labels))


def test_keyboard_interrupt_keeps_finished_trials_and_plan(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    plan_path = tmp_path / "best.json"

    def interrupt(study, trial):
        if trial.number >= 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _search(
            Budget("val_accuracy", max_drop=0.2), 10, storage, "interrupted",
            plan_path=plan_path, callbacks=[interrupt],
        )  # fmt: skip
    study = optuna.load_study(study_name="interrupted", storage=storage)
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) == 2
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE
    assert autoprec.PrecisionPlan.load(plan_path).metadata["budget"]["metric"] == "val_accuracy"
    feasible = [t for t in finished if t.constraints and max(t.constraints.values()) <= 0]
    best = min(feasible, key=lambda t: (t.value, t.number))
    assert plan_file_trial(plan_path, "interrupted") == best.number
    assert plan_file_trial(plan_path, "another study") is None
    assert plan_file_trial(tmp_path / "missing.json", "interrupted") is None


@pytest.mark.parametrize("kind", [pytest.param("sqlite", marks=pytest.mark.slow), "journal"])
def test_two_processes_share_one_study(tmp_path, kind):
    storage = f"sqlite:///{tmp_path / 'shared.db'}" if kind == "sqlite" else str(tmp_path / "s.log")
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                storage,
                "3",
                "--study-name",
                "shared",
                "--seed",
                str(seed),
                "--dtypes",
                "float32,bfloat16",
                "--train-steps",
                "2",
            ],
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for seed in (1, 2)
    ]
    for worker in workers:
        _, stderr = worker.communicate(timeout=300)
        assert worker.returncode == 0, stderr.decode()[-2000:]
    study = optuna.load_study(study_name="shared", storage=resolve_storage(storage))
    numbers = [t.number for t in study.trials if t.state.is_finished()]
    # 6 trials, and the finalists the measured ranking added (a protection dropped).
    assert len(numbers) >= 6 and len(set(numbers)) == len(numbers)
    labels = [r.warm_start for r in map(TrialRecord.from_trial, study.trials) if r.warm_start]
    assert "float32" in labels and len(labels) == len(set(labels))
    assert study.user_attrs[WARM_STARTS_MARK] is True
    assert optuna.get_all_study_names(resolve_storage(storage)) == ["shared"]  # lock released


def test_an_assignment_already_trained_is_reused_across_runs_of_one_study(tmp_path):
    storage = str(tmp_path / "reuse.log")
    budget = Budget("val_accuracy", max_drop=0.05)
    for n_trials in (3, 6):  # two groups: four assignments in all, so TPE repeats
        _search(budget, n_trials, storage, "reuse", group_by=1)
    study = optuna.load_study(study_name="reuse", storage=resolve_storage(storage))
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    records = {t.number: TrialRecord.from_trial(t) for t in study.trials}
    trained: dict[str, int] = {}
    for trial in complete:
        record = records[trial.number]
        key, source = record.assignment_key, record.reused_from
        if source is None:
            assert key not in trained, f"trial {trial.number} trained {key} again"
            trained[key] = trial.number
        elif source != "reference":
            assert records[source].assignment_key == key
            assert records[source].metric == record.metric
    reused = [records[t.number] for t in complete if records[t.number].reused]
    assert reused and any(isinstance(r.reused_from, int) and r.reused_from < 3 for r in reused)
