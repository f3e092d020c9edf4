"""Tests for `autoprec.search.study`: storages, resume, interruption, processes sharing a study."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import keras
import optuna
import pytest
from search.search_models import compiled_mlp, fast, mlp_data

import autoprec
from autoprec.search import Budget, resolve_storage, search


def test_resume_accumulates_without_duplicate_warm_starts(tmp_path):
    storage = str(tmp_path / "study.log")
    train, val = mlp_data()
    budget = Budget("val_accuracy", max_drop=0.2)
    for _ in range(2):
        keras.utils.set_random_seed(0)
        search(
            compiled_mlp(),
            train,
            val,
            budget=budget,
            n_trials=3,
            storage=storage,
            study_name="s",
            **fast(),
        )
    study = optuna.load_study(study_name="s", storage=resolve_storage(storage))
    assert len(study.trials) == 6
    labels = [
        t.user_attrs.get("warm_start") for t in study.trials if t.user_attrs.get("warm_start")
    ]
    assert len(labels) == len(set(labels))


def test_keyboard_interrupt_keeps_finished_trials_and_plan(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    plan_path = tmp_path / "best.json"
    train, val = mlp_data()

    def interrupt(study, trial):
        if trial.number >= 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        search(
            compiled_mlp(),
            train,
            val,
            budget=Budget("val_accuracy", max_drop=0.2),
            n_trials=10,
            storage=storage,
            study_name="interrupted",
            **fast(plan_path=plan_path, callbacks=[interrupt]),
        )
    study = optuna.load_study(study_name="interrupted", storage=storage)
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) == 2
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE
    assert autoprec.PrecisionPlan.load(plan_path).metadata["budget"]["metric"] == "val_accuracy"


_WORKER = textwrap.dedent(
    """
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.path.insert(0, {tests!r})
    import keras
    from conftest import build_mlp, classification_data
    from autoprec.search import Budget, SearchSettings, search
    keras.utils.set_random_seed(0)
    model = build_mlp()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = classification_data(samples=192)
    search(model, (x[:128], y[:128]), (x[128:], y[128:]),
           budget=Budget("val_accuracy", max_drop=0.2), hardware="rtx4090", n_trials=3,
           storage=sys.argv[1], study_name="shared", verbose=0,
           settings=SearchSettings(dtypes=["float32", "bfloat16"], steps_per_trial=2,
                                   seed=int(sys.argv[2])))
    """
)


@pytest.mark.parametrize("kind", [pytest.param("sqlite", marks=pytest.mark.slow), "journal"])
def test_two_processes_share_one_study(tmp_path, kind):
    import pathlib

    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(tests=str(pathlib.Path(__file__).parent.parent)))
    storage = f"sqlite:///{tmp_path / 'shared.db'}" if kind == "sqlite" else str(tmp_path / "s.log")
    if kind == "sqlite":
        optuna.storages.RDBStorage(storage)  # create the schema once, before the workers
    workers = [
        subprocess.Popen([sys.executable, str(script), storage, str(seed)], stderr=subprocess.PIPE)
        for seed in (1, 2)
    ]
    for worker in workers:
        _, stderr = worker.communicate(timeout=300)
        assert worker.returncode == 0, stderr.decode()[-2000:]
    study = optuna.load_study(study_name="shared", storage=resolve_storage(storage))
    numbers = [t.number for t in study.trials]
    assert len(numbers) == 6 and len(set(numbers)) == 6
    labels = [t.user_attrs["warm_start"] for t in study.trials if "warm_start" in t.user_attrs]
    assert len(labels) == len(set(labels))


def test_resolve_storage_opens_journal_files_and_passes_the_rest(tmp_path):
    from optuna.storages import JournalStorage

    assert resolve_storage(None) is None
    assert isinstance(resolve_storage(str(tmp_path / "a.log")), JournalStorage)
    assert isinstance(resolve_storage(tmp_path / "b.log"), JournalStorage)
    assert isinstance(resolve_storage(f"journal://{tmp_path / 'c.journal'}"), JournalStorage)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    assert resolve_storage(url) == url
    storage = optuna.storages.InMemoryStorage()
    assert resolve_storage(storage) is storage


def test_an_assignment_already_trained_is_reused_across_runs_of_one_study(tmp_path):
    storage = str(tmp_path / "reuse.log")
    train, val = mlp_data()
    budget = Budget("val_accuracy", max_drop=0.05)
    settings = fast(group_by=1)  # two groups: four assignments in all, so TPE repeats
    for n_trials in (3, 6):
        keras.utils.set_random_seed(0)
        search(
            compiled_mlp(), train, val, budget=budget, n_trials=n_trials, storage=storage,
            study_name="reuse", **settings,
        )  # fmt: skip
    study = optuna.load_study(study_name="reuse", storage=resolve_storage(storage))
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    trained: dict[str, int] = {}
    for trial in complete:
        key = trial.user_attrs["assignment_key"]
        source = trial.user_attrs.get("reused_from")
        if source is None:
            assert key not in trained, f"trial {trial.number} trained {key} again"
            trained[key] = trial.number
        elif source != "reference":
            assert study.trials[source].user_attrs["assignment_key"] == key
            assert study.trials[source].user_attrs["metric"] == trial.user_attrs["metric"]
    reused = [t for t in complete if t.user_attrs.get("reused_from") is not None]
    assert reused and any(
        isinstance(t.user_attrs["reused_from"], int) and t.user_attrs["reused_from"] < 3
        for t in reused
    )
