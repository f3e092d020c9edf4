"""Tests for `autoprec.search.warm_start`: the plans every study starts with, enqueued once."""

from __future__ import annotations

import optuna
from search.search_models import prepared_search

from autoprec.search import TrialRecord
from autoprec.search.record import WARM_STARTS_MARK, assignment_key
from autoprec.search.storage import claim_study_lock, resolve_storage
from autoprec.search.warm_start import WarmStart, enqueue_warm_starts, has_warm_starts, warm_starts


def test_every_study_starts_with_float32_the_uniform_plans_and_the_heuristic():
    with prepared_search() as prepared:
        context, space = prepared.context, prepared.space
        starts = warm_starts(
            context, prepared.model, space.profile, space.table, space.hardware, space.dtypes, ()
        )
        labels = [start.label for start in starts]
        assert labels[0] == "float32" and "uniform bfloat16" in labels
        assert len({assignment_key(start.assignment) for start in starts}) == len(starts)
        for start in starts:
            assert set(start.assignment) == set(context.compute)
            assert context.assignment(start.params).keys() == start.assignment.keys()


def test_warm_starts_are_enqueued_once_with_their_records(tmp_path):
    path = tmp_path / "warm.log"
    optuna.create_study(storage=resolve_storage(path), study_name="s")
    study = optuna.load_study(study_name="s", storage=resolve_storage(path))
    starts = [
        WarmStart("float32", {"dense": "float32"}, {"dense": "float32"}),
        WarmStart("uniform bfloat16", {"dense": "bfloat16"}, {"dense": "bfloat16"}),
    ]
    assert not has_warm_starts(study)
    assert enqueue_warm_starts(study, starts) == 2
    assert has_warm_starts(study) and study.user_attrs[WARM_STARTS_MARK] is True
    records = [TrialRecord.from_trial(trial) for trial in study.trials]
    assert [(r.warm_start, r.assignment) for r in records] == [
        ("float32", {"dense": "float32"}),
        ("uniform bfloat16", {"dense": "bfloat16"}),
    ]
    assert records[0].assignment_key == assignment_key({"dense": "float32"})
    assert enqueue_warm_starts(study, starts) == 0  # a resumed run
    assert optuna.get_all_study_names(resolve_storage(path)) == ["s"]  # the lock is released


def test_a_process_that_finds_the_lock_taken_enqueues_nothing_and_does_not_wait(tmp_path):
    path = tmp_path / "busy.log"
    optuna.create_study(storage=resolve_storage(path), study_name="s")
    holder, other = (
        optuna.load_study(study_name="s", storage=resolve_storage(path)) for _ in range(2)
    )
    assert claim_study_lock(holder, "warm-starts") is not None
    assert enqueue_warm_starts(other, [WarmStart("float32", {"d": "float32"}, {})]) == 0
    assert not other.trials and not has_warm_starts(other)
