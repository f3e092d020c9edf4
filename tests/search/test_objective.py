"""Tests for `autoprec.search.objective`: what a trial records, reuses and is pruned for."""

from __future__ import annotations

import optuna
from search.search_models import prepared_search

from autoprec.search import TrialRecord
from autoprec.search.objective import trial_objective
from autoprec.search.study import FidelityPruner, is_feasible


def test_a_trial_records_its_stages_and_the_same_assignment_is_trained_once():
    with prepared_search() as prepared:
        context = prepared.context
        study = optuna.create_study(pruner=FidelityPruner(0.5))
        bfloat16 = context.uniform_assignment("bfloat16")
        for assignment in (bfloat16, bfloat16, context.uniform_assignment("float32")):
            study.enqueue_trial(
                context.params_for(assignment),
                user_attrs=TrialRecord(warm_start="w", assignment=assignment).to_user_attrs(),
                skip_if_exists=False,
            )
        study.optimize(lambda trial: trial_objective(context, trial), n_trials=3)
        trained, again, float32 = (TrialRecord.from_trial(t) for t in study.trials)
        assert trained.assignment == bfloat16 and trained.train_steps == context.train_steps
        assert trained.fidelity == ("profile", "proxy", "train")
        assert trained.evaluating == 0 and trained.proxy_score is not None
        assert trained.dtype_counts["bfloat16"] == len(bfloat16)
        assert trained.predicted_seconds > 0 and trained.activation_bytes_per_sample > 0
        assert set(trained.metrics) >= {"accuracy", "loss"} and trained.metric is not None
        assert (trained.budget_violation <= 0) == is_feasible(study.trials[0])
        assert again.reused and again.reused_from == 0 and again.metric == trained.metric
        assert again.evaluating is None  # it evaluated nothing itself
        assert float32.reused_from == "reference" and float32.metric == context.reference
        assert study.trials[0].value == study.trials[1].value  # one assignment, one cost


def test_a_plan_predicted_no_faster_than_the_best_within_budget_is_pruned_before_training():
    with prepared_search() as prepared:
        context = prepared.context
        study = optuna.create_study(pruner=FidelityPruner(0.5))
        float32 = context.uniform_assignment("float32")
        study.enqueue_trial(
            context.params_for(float32),
            user_attrs=TrialRecord(warm_start="float32", assignment=float32).to_user_attrs(),
        )
        bfloat16 = context.uniform_assignment("bfloat16")  # slower on this launch-bound MLP
        assert context.costs.step(bfloat16)[0] > context.costs.step(float32)[0]
        study.enqueue_trial(
            context.params_for(bfloat16),
            user_attrs=TrialRecord(assignment=bfloat16).to_user_attrs(),  # not a warm start
        )
        study.optimize(lambda trial: trial_objective(context, trial), n_trials=2)
        first, second = study.trials
        assert first.state == optuna.trial.TrialState.COMPLETE and is_feasible(first)
        assert second.state == optuna.trial.TrialState.PRUNED
        record = TrialRecord.from_trial(second)
        assert record.pruned_by.startswith("cost:") and record.metrics is None
        assert record.evaluating == 1 and record.fidelity == ("profile",)
