"""Tests for `autoprec.search.plan_writer`: the best plan so far on disk, one log line per trial."""

from __future__ import annotations

import logging

import optuna
from search.search_models import prepared_search

from autoprec.plan import PrecisionPlan
from autoprec.search import TrialRecord
from autoprec.search.study import log_trial, plan_file_trial, plan_writer, trial_plan_metadata


def _add(study, context, dtype, value, violation):
    record = TrialRecord(
        assignment=context.uniform_assignment(dtype), predicted_seconds=value, metric=0.5
    )
    study.add_trial(
        optuna.trial.create_trial(
            value=value, user_attrs=record.to_user_attrs(), constraints={"budget": violation}
        )
    )
    return study.trials[-1]


def test_the_file_holds_the_best_trial_within_budget_and_says_which(tmp_path, caplog):
    path = tmp_path / "best.json"
    with prepared_search() as prepared:
        context = prepared.context
        context.verbose = 1
        study = optuna.create_study(study_name="writer")
        callback = plan_writer(context, path, {"search": {"study_name": "writer"}})
        float32 = _add(study, context, "float32", 2.0, -1.0)
        with caplog.at_level(logging.INFO, logger="autoprec"):
            callback(study, float32)
        assert plan_file_trial(path, "writer") == 0
        assert "trial 0:" in caplog.text and "written to" in caplog.text
        missed = _add(study, context, "bfloat16", 1.0, 0.5)  # faster, over budget: not written
        callback(study, missed)
        assert plan_file_trial(path, "writer") == 0
        better = _add(study, context, "bfloat16", 1.5, -0.5)
        callback(study, better)
        assert plan_file_trial(path, "writer") == 2
        plan = PrecisionPlan.load(path)
        assert set(plan.layers.values()) >= {"bfloat16"}
        assert plan.metadata["predicted_speedup"] == context.float32_seconds / 1.5
        assert plan.metadata["measured_metric"] == 0.5
        assert plan_file_trial(path, "another") is None
        assert plan_file_trial(tmp_path / "missing.json", "writer") is None


def test_metadata_and_log_lines_come_from_the_record(caplog):
    with prepared_search() as prepared:
        context = prepared.context
        study = optuna.create_study()
        trial = _add(study, context, "bfloat16", 0.25, -1.0)
        metadata = trial_plan_metadata(context, trial, {"search": {"seed": 0}})
        assert metadata["search"] == {"seed": 0, "best_trial": 0}
        assert metadata["reference_metric"] == context.reference
        with caplog.at_level(logging.INFO, logger="autoprec"):
            log_trial(context, trial)  # verbose 0: silent
            assert "trial 0" not in caplog.text
            context.verbose = 2
            log_trial(context, trial)
        assert "trial 0:" in caplog.text and "250.000 ms" in caplog.text and "| ok" in caplog.text
