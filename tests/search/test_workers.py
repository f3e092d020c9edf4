"""Tests for `autoprec.search.workers`: one study searched by several local processes."""

from __future__ import annotations

import optuna
import pytest
from conftest import build_mlp, classification_data
from pg_server import postgres_server  # noqa: F401  (the session fixture `postgres`)

from autoprec.search import (
    Budget,
    SearchSettings,
    TrialRecord,
    resolve_storage,
    search_in_processes,
)


@pytest.mark.parametrize("kind", ["journal", pytest.param("postgres", marks=pytest.mark.slow)])
def test_two_processes_search_one_study_and_the_caller_gets_its_best_plan(tmp_path, request, kind):
    if kind == "postgres":
        storage = request.getfixturevalue("postgres").create_database("pool")
    else:
        storage = tmp_path / "workers.log"
    model = build_mlp()
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = classification_data(samples=192)
    result = search_in_processes(
        2,
        model,
        (x[:128], y[:128]),
        (x[128:], y[128:]),
        budget=Budget("val_accuracy", max_drop=0.05),
        storage=storage,
        study_name="pool",
        n_trials=3,
        hardware="rtx4090",
        verbose=0,
        settings=SearchSettings(dtypes=["float32", "bfloat16"], steps_per_trial=2),
    )
    study = optuna.load_study(study_name="pool", storage=resolve_storage(str(storage)))
    # 2 workers x 3 trials, and the finalists the caller's measured ranking added.
    count = len(study.trials)
    assert count >= 6 and len({t.number for t in study.trials}) == count
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    labels = [r.warm_start for r in map(TrialRecord.from_trial, study.trials) if r.warm_start]
    assert labels and len(labels) == len(set(labels))  # enqueued once across workers
    assert result.study.study_name == "pool" and len(result.study.trials) == count
    assert result.plan.metadata["search"]["trials"] == count
