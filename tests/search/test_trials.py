"""Tests for `run_trials`: the trial stage opens the study and runs its trials."""

from __future__ import annotations

import dataclasses

from search.search_models import prepared_search

from autoprec.search import TrialRecord
from autoprec.search.preparation import run_trials
from autoprec.search.record import REFERENCE_METRIC_ATTR


def test_the_trial_stage_starts_with_the_warm_starts_and_records_the_reference(tmp_path):
    with prepared_search() as prepared:
        request = dataclasses.replace(
            prepared.request, storage=str(tmp_path / "t.log"), study_name="t", n_trials=2
        )
        prepared.context.request = request
        study = run_trials(prepared.context)
        assert study.study_name == "t" and len(study.trials) >= 2
        labels = [TrialRecord.from_trial(t).warm_start for t in study.trials[:2]]
        assert labels == ["float32", "uniform bfloat16"]
        assert study.user_attrs[REFERENCE_METRIC_ATTR] == prepared.context.reference
        assert prepared.context.metadata["search"]["study_name"] == "t"
        assert request.clock.seconds["trials"] > 0
        again = run_trials(prepared.context)
        finished = [t for t in again.trials if t.state.is_finished()]
        assert len(finished) == 4  # resumed: two more, no warm start enqueued twice
