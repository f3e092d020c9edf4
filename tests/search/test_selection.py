"""Tests for `autoprec.search.selection`: ranking, choosing and building the search's result."""

from __future__ import annotations

import dataclasses

import optuna
from search.search_models import prepared_search

from autoprec.search import SearchResult, TrialRecord
from autoprec.search.selection import Choice, Ranking, build_result, choose_plan, rank_trials
from autoprec.search.trials import run_trials


def _study(context, entries):
    study = optuna.create_study()
    for dtype, value, violation in entries:
        assignment = context.uniform_assignment(dtype)
        record = TrialRecord(
            warm_start=f"uniform {dtype}", assignment=assignment, predicted_seconds=value
        )
        study.add_trial(
            optuna.trial.create_trial(
                value=value, user_attrs=record.to_user_attrs(), constraints={"budget": violation}
            )
        )
    return study


def test_the_ranking_is_one_trial_per_assignment_within_budget_cheapest_first():
    with prepared_search(measure_speedup=False) as prepared:
        context = prepared.context
        study = _study(
            context,
            [("float32", 2.0, -1.0), ("bfloat16", 1.0, -1.0), ("bfloat16", 1.0, -1.0),
             ("bfloat16", 0.5, 1.0)],
        )  # fmt: skip
        ranking = rank_trials(context, study, prepared.request)
        assert isinstance(ranking, Ranking) and ranking.measured is None and not ranking.measure
        assert [t.number for t in ranking.trials] == [1, 0]
        choice = choose_plan(context, ranking, prepared.reference, prepared.request)
        assert isinstance(choice, Choice) and choice.trial.number == 1
        assert choice.timing is None and choice.replaced_by is None
        assert set(choice.plan.layers.values()) == {"bfloat16"}


def test_nothing_within_budget_returns_float32(caplog):
    with prepared_search(measure_speedup=False) as prepared:
        study = _study(prepared.context, [("bfloat16", 1.0, 1.0)])
        ranking = rank_trials(prepared.context, study, prepared.request)
        assert ranking.trials == () and "no plan met the budget" in caplog.text
        choice = choose_plan(prepared.context, ranking, prepared.reference, prepared.request)
        assert choice.trial is None and set(choice.plan.layers.values()) == {"float32"}


def test_the_result_carries_the_chosen_plan_and_its_metadata(tmp_path):
    path = tmp_path / "plan.json"
    with prepared_search(measure_speedup=False, confirm_steps=0, plan_path=path) as prepared:
        context, request = prepared.context, prepared.request
        run = run_trials(prepared.model, context, request, prepared.space, prepared.reference)
        ranking = rank_trials(context, run.study, request)
        choice = choose_plan(context, ranking, prepared.reference, request)
        result = build_result(context, prepared.space, prepared.reference, run, choice, request)
        assert isinstance(result, SearchResult) and result.study is run.study
        metadata = result.plan.metadata
        search = metadata["search"]
        assert search["best_trial"] == choice.trial.number and search["trials"] == 2
        assert search["confirmation"] == dict(choice.confirmation.record)
        assert set(search["warm_starts"]) >= {"float32", "uniform bfloat16"}
        assert set(search["stage_seconds"]) >= {"costs", "trials", "confirmation"}
        assert metadata["measured_speedup"] is None
        assert set(metadata["evidence"]) == set(context.compute)
        assert path.exists() and result.points


def test_a_measured_choice_records_its_step_times():
    with prepared_search(hardware="local", confirm_steps=0) as prepared:
        context = prepared.context
        request = dataclasses.replace(prepared.request, n_trials=2)
        run = run_trials(prepared.model, context, request, prepared.space, prepared.reference)
        ranking = rank_trials(context, run.study, request)
        assert ranking.measure and ranking.measured is not None
        choice = choose_plan(context, ranking, prepared.reference, request)
        result = build_result(context, prepared.space, prepared.reference, run, choice, request)
        search = result.plan.metadata["search"]
        assert search["measured_plan_step_seconds"] == choice.timing.plan_seconds
        assert set(search["measured_step_rounds"]) == set(ranking.measured.order)
        assert result.plan.metadata["measured_speedup"] == choice.timing.speedup
