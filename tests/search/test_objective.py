"""Tests for `autoprec.search.objective`: what a trial records, reuses, is pruned or refused for."""

from __future__ import annotations

import keras
import optuna
from search.search_models import (
    far_regression,
    far_targets,
    fast,
    labelled,
    prepared_search,
    wide_classifier,
)

from autoprec.search import Budget, TrialRecord, search
from autoprec.search.floor import OUTPUT_FLOOR_ATTR
from autoprec.search.study import FidelityPruner, is_feasible, trial_objective


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


def _enqueue(study, context, label, assignment):
    study.enqueue_trial(
        context.params_for(assignment),
        user_attrs=TrialRecord(warm_start=label, assignment=assignment).to_user_attrs(),
        skip_if_exists=False,
    )


def test_a_16_bit_head_that_holds_a_short_trial_is_refused_for_its_rounding_floor():
    keras.utils.set_random_seed(0)
    budget = Budget("val_mae", max_relative_drop=0.5)  # loose enough for 2 train steps anywhere
    with prepared_search(far_regression(), far_targets(), budget, proxy_batches=1) as prepared:
        context = prepared.context
        uniform = context.uniform_assignment("bfloat16")
        trained = context.evaluator.train_and_evaluate(context.plan_for(uniform))
        assert budget.violation(context.reference, trained["mae"]) <= 0  # what a trial sees
        study = optuna.create_study(pruner=FidelityPruner(0.5))
        _enqueue(study, context, "uniform bfloat16", uniform)
        _enqueue(study, context, "safe head", {**uniform, "head": "float32"})
        study.optimize(lambda trial: trial_objective(context, trial), n_trials=2)
        refused, safe = study.trials
        assert refused.state == optuna.trial.TrialState.COMPLETE and not is_feasible(refused)
        assert refused.constraints[OUTPUT_FLOOR_ATTR] > 0 and "budget" not in refused.constraints
        record = TrialRecord.from_trial(refused)
        assert record.fidelity == ("profile", "floor") and record.metrics is None
        assert record.budget_violation == refused.constraints[OUTPUT_FLOOR_ATTR]
        floor = refused.user_attrs[OUTPUT_FLOOR_ATTR]
        assert floor["refused"] and floor["dtypes"] == {"head": "bfloat16"}
        assert floor["sources"] == {"head": "targets"} and floor["value"] > 0.5  # ~1 MAE
        assert "'head'" in floor["reason"] and "no training removes" in floor["reason"]
        assert is_feasible(safe) and OUTPUT_FLOOR_ATTR not in safe.user_attrs
        assert TrialRecord.from_trial(safe).fidelity[-1] == "train"
        metadata = context.floor_metadata(study)
        assert metadata["refused_trials"] == {"0": floor["reason"]}
        assert metadata["outputs"]["head"]["bfloat16"]["refused"]
        assert metadata["rule"] == {"fraction": 0.5, "headroom": 10.0}


def test_a_classifier_s_16_bit_head_keeps_a_negligible_floor_and_is_trained():
    budget = Budget("val_loss", max_relative_drop=0.02)
    with prepared_search(budget=budget) as prepared:
        context = prepared.context
        uniform = context.uniform_assignment("bfloat16")
        floor = context.output_floor(uniform)
        assert floor.sources == {"dense_2": "float32 outputs"} and not floor.refused
        assert floor.value < 0.01 * floor.limit  # float32 noise in the loss, no floor
        study = optuna.create_study(pruner=FidelityPruner(0.5))
        _enqueue(study, context, "uniform bfloat16", uniform)
        study.optimize(lambda trial: trial_objective(context, trial), n_trials=1)
        (trial,) = study.trials
        assert trial.constraints[OUTPUT_FLOOR_ATTR] < 0 and "budget" in trial.constraints
        assert TrialRecord.from_trial(trial).fidelity[-1] == "train"
        assert not trial.user_attrs[OUTPUT_FLOOR_ATTR]["refused"]
        assert context.output_floor(context.uniform_assignment("float32")) is None


def test_search_on_a_far_regression_never_returns_a_16_bit_head_and_says_why_once(capsys):
    keras.utils.set_random_seed(0)
    train, val = far_targets()
    result = search(
        far_regression(),
        train,
        val,
        budget=Budget("val_mae", max_relative_drop=0.35),
        n_trials=4,
        **fast(verbose=1, cost_batch_size=4096, confirm_steps=0),
    )
    assert result.plan.layers["head"] == "float32"
    assert result.plan.layers["wide1"] == "bfloat16"  # the rest still gains
    refused = [t for t in result.study.trials if t.user_attrs.get(OUTPUT_FLOOR_ATTR)]
    assert refused and all(t.user_attrs[OUTPUT_FLOOR_ATTR]["refused"] for t in refused)
    assert all(not is_feasible(t) for t in refused)
    assert capsys.readouterr().out.count("no training removes") == 1
    # The plan says why its head stayed float32, and which trials the floor refused.
    recorded = result.plan.metadata["search"]["output_floor"]
    assert recorded["refused_trials"]
    assert result.plan.metadata["evidence"]["head"]["output_floor"]["bfloat16"]["refused"]


def test_search_on_a_classifier_may_still_return_a_16_bit_head():
    keras.utils.set_random_seed(0)
    model = wide_classifier()
    train, val = labelled(model, 512)
    result = search(
        model,
        train,
        val,
        budget=Budget("val_accuracy", max_drop=0.1),
        n_trials=3,
        **fast(steps_per_trial=4, cost_batch_size=4096, confirm_steps=0),
    )
    floors = [
        t.user_attrs[OUTPUT_FLOOR_ATTR]
        for t in result.study.trials
        if t.user_attrs.get(OUTPUT_FLOOR_ATTR)
    ]
    assert floors and all(not floor["refused"] and floor["value"] == 0.0 for floor in floors)
    assert result.plan.layers["head"] == "bfloat16"
