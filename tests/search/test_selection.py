"""Tests for `autoprec.search.selection`: ranking, choosing and building the search's result."""

from __future__ import annotations

import dataclasses

import optuna
from search.search_models import (
    attention_classifier,
    far_regression,
    far_targets,
    labelled,
    prepared_search,
)

import autoprec
from autoprec.plan import PrecisionPlan
from autoprec.search import Budget, SearchResult, TrialRecord
from autoprec.search.confirmation import (
    finalist_key,
    finalist_plan,
    measurement_candidates,
    rank_by_measurement,
    ranked_finalists,
)
from autoprec.search.floor import OUTPUT_FLOOR_ATTR
from autoprec.search.preparation import run_trials
from autoprec.search.record import assignment_key
from autoprec.search.selection import (
    Choice,
    Finalists,
    Ranking,
    add_finalists,
    build_result,
    choose_plan,
    rank_trials,
)


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
        context.study = study
        ranking = rank_trials(context)
        assert isinstance(ranking, Ranking) and ranking.measured is None and not ranking.measure
        assert [t.number for t in ranking.trials] == [1, 0]
        choice = choose_plan(context, ranking)
        assert isinstance(choice, Choice) and choice.trial.number == 1
        assert choice.timing is None and choice.replaced_by is None
        assert set(choice.plan.layers.values()) == {"bfloat16"}


def test_nothing_within_budget_returns_float32(caplog):
    with prepared_search(measure_speedup=False) as prepared:
        study = _study(prepared.context, [("bfloat16", 1.0, 1.0)])
        prepared.context.study = study
        ranking = rank_trials(prepared.context)
        assert ranking.trials == () and "no plan met the budget" in caplog.text
        choice = choose_plan(prepared.context, ranking)
        assert choice.trial is None and set(choice.plan.layers.values()) == {"float32"}


def test_the_result_carries_the_chosen_plan_and_its_metadata(tmp_path):
    path = tmp_path / "plan.json"
    with prepared_search(measure_speedup=False, confirm_steps=0, plan_path=path) as prepared:
        context = prepared.context
        run_trials(context)
        ranking = rank_trials(context)
        choice = choose_plan(context, ranking)
        result = build_result(context, choice)
        assert isinstance(result, SearchResult) and result.study is context.study
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
        context.request = dataclasses.replace(prepared.request, n_trials=2)
        run_trials(context)
        ranking = rank_trials(context)
        assert ranking.measure and ranking.measured is not None
        choice = choose_plan(context, ranking)
        result = build_result(context, choice)
        search = result.plan.metadata["search"]
        assert search["measured_plan_step_seconds"] == choice.timing.plan_seconds
        assert set(search["measured_step_rounds"]) == set(ranking.measured.order)
        measurement = search["measurement"] if "measurement" in search else None
        assert measurement is None  # recorded when build_result is given the ranking
        recorded = build_result(context, choice, ranking).plan.metadata["search"]["measurement"]
        assert recorded["verdict"] in ("separated", "tie")
        assert recorded["leader"] == ranking.measured.order[0]
        assert set(recorded["median_seconds"]) == set(ranking.measured.order)
        assert result.plan.metadata["measured_speedup"] == choice.timing.speedup


def _feasible(study, context, label, assignment, value):
    record = TrialRecord(
        warm_start=label,
        assignment=context.normalise(assignment),
        assignment_key=assignment_key(context.normalise(assignment)),
        train_steps=context.train_steps,
        predicted_seconds=value,
        metrics={"accuracy": 1.0},
        metric=1.0,
        budget_violation=-1.0,
    )
    study.add_trial(
        optuna.trial.create_trial(
            value=value, user_attrs=record.to_user_attrs(), constraints={"budget": -1.0}
        )
    )
    return study.trials[-1]


def test_finalists_are_keras_global_policies_and_protections_the_profile_lets_go():
    model = attention_classifier()
    train, val = labelled(model, 256)
    prof = autoprec.profile(model, train, steps=2, batch_size=32, verbose=0)
    with prepared_search(model, (train, val), profile=prof, cost_batch_size=4096) as prepared:
        context = prepared.context
        protected = {
            **context.uniform_assignment("bfloat16"),
            "attention/softmax": "float32",
            "norm": "float32",
            "head": "float32",
        }
        study = optuna.create_study()
        base = _feasible(study, context, "heuristic", protected, 1e-9)  # the cheapest plan
        context.study = study
        finalists = add_finalists(context)
        assert isinstance(finalists, Finalists) and finalists.base_trial == base.number
        labels = {"no float32 softmax", "no float32 normalisation", "no float32 outputs"}
        assert {"keras mixed_bfloat16", *labels} <= set(finalists.trials)
        trials = {label: study.trials[number] for label, number in finalists.trials.items()}
        keras_trial = trials["keras mixed_bfloat16"]
        record = TrialRecord.from_trial(keras_trial)
        assert keras_trial.state == optuna.trial.TrialState.COMPLETE and record.fidelity
        assert record.metric is not None and "budget" in keras_trial.constraints
        exact = finalist_plan(context, keras_trial)
        assert exact.layers == PrecisionPlan.uniform(model, "bfloat16").layers
        assert set(exact.resolve().values()) == {"bfloat16"}
        for kind, path in (("softmax", "attention/softmax"), ("normalisation", "norm")):
            dropped = TrialRecord.from_trial(trials[f"no float32 {kind}"])
            assert dropped.assignment == {**protected, path: "bfloat16"}
            assert dropped.metrics is not None  # trained and held to the budget like any trial
        again = add_finalists(context)  # a resumed study
        assert again.trials == finalists.trials and len(study.trials) == len(trials) + 1
        ranked = ranked_finalists(context, study)
        plans = {finalist_key(context, trial) for trial in ranked}
        assert len(plans) == len(ranked) and keras_trial.number in {t.number for t in ranked}


def test_without_a_profile_no_protection_is_dropped_and_keras_is_a_trial_s_plan():
    with prepared_search(cost_batch_size=4096) as prepared:  # bfloat16 only: no profile
        context = prepared.context
        assert context.profile is None
        study = optuna.create_study()
        uniform = _feasible(
            study, context, "uniform bfloat16", context.uniform_assignment("bfloat16"), 1.0
        )
        context.study = study
        finalists = add_finalists(context)
        # The MLP has no container: Keras' mixed_bfloat16 is the uniform plan, not trained again.
        assert finalists.trials == {"keras mixed_bfloat16": uniform.number}
        assert finalists.same_as == {"keras mixed_bfloat16": "uniform bfloat16"}
        assert len(study.trials) == 1
        reasons = {finalists.skipped[f"no float32 {kind}"] for kind in ("normalisation", "outputs")}
        assert reasons == {"no profile to show the ranges fit"}


def test_a_search_returns_float32_when_float32_measures_fastest():
    with prepared_search(hardware="local", confirm_steps=0) as prepared:
        context = prepared.context
        run_trials(context)
        finalists = add_finalists(context)
        ranked = ranked_finalists(context, context.study)
        candidates = measurement_candidates(context, ranked)
        assert candidates[0].trial.number == ranked[0].number
        assert {"float32", "keras mixed_bfloat16"} <= {c.name for c in candidates} | set(
            finalists.same_as
        )
        rounds = {  # float32 fastest beyond the noise in every round
            c.name: [0.5 + 0.001 * i if c.name == "float32" else 1.0 + 0.001 * i for i in range(5)]
            for c in candidates
        }
        measured = rank_by_measurement(ranked, {c.name: c.trial for c in candidates}, rounds)
        ranking = Ranking(measured.trials, measured, True)
        choice = choose_plan(context, ranking)
        assert set(choice.plan.resolve().values()) == {"float32"}
        result = build_result(context, choice, ranking, finalists)
        search = result.plan.metadata["search"]
        assert search["measurement"]["leader"] == "float32"
        assert search["measurement"]["verdict"] == "separated"
        assert search["measurement"]["rounds"]["float32"] == rounds["float32"]
        assert search["finalists"] == finalists.to_dict()
        assert result.plan.metadata["measured_speedup"] == 1.0
        assert "float32 at 502 ms median, ahead of every other plan beyond the noise" in (
            result.report()
        )


def test_a_keras_global_policy_its_output_floor_refuses_is_recorded_untrained():
    budget = Budget("val_mae", max_relative_drop=0.1)  # a bfloat16 head cannot resolve 1000
    with prepared_search(far_regression(), far_targets(), budget, proxy_batches=1) as prepared:
        context = prepared.context
        study = optuna.create_study()
        context.study = study
        finalists = add_finalists(context)
        trial = study.trials[finalists.trials["keras mixed_bfloat16"]]
        record = TrialRecord.from_trial(trial)
        assert trial.state == optuna.trial.TrialState.COMPLETE
        assert record.fidelity == ("profile", "floor") and record.metrics is None
        assert trial.constraints[OUTPUT_FLOOR_ATTR] > 0 and "budget" not in trial.constraints
        assert trial.user_attrs[OUTPUT_FLOOR_ATTR]["refused"]
        assert ranked_finalists(context, study) == []  # never timed, ranked or returned
