"""Tests for autoprec.search.finalists: Keras' global policies and protection-dropped plans.

Each test runs the first stages of a real, small search (a float32 reference trained by the
search's `Evaluator`, a `SearchContext`) and a real Optuna study: `add_finalists` trains
Keras' global policies (containers included) and adds them as completed trials judged by
the budget, lets a trial with the same plan stand for one instead of training it again, and
runs the best plan with one float32 protection dropped through the trial objective. A
counting wrapper around the context's own `Evaluator.train_and_evaluate` tells what was
trained.
"""

from __future__ import annotations

import dataclasses
import logging

import keras
import optuna
import pytest
from search.search_models import compiled_mlp, labelled, mlp_data, prepared_search

import autoprec
from autoprec.search import TrialRecord
from autoprec.search.confirmation import finalist_plan, keras_global_plan, ranked_finalists
from autoprec.search.preparation import run_trials
from autoprec.search.record import assignment_key, dropped_label, keras_label
from autoprec.search.selection import Finalists, add_finalists
from autoprec.search.warm_start import WarmStart, enqueue_candidates

KERAS_BF16 = keras_label("bfloat16")
KERAS_F16 = keras_label("float16")


def _tiny_attention() -> keras.Model:
    """A one-head `MultiHeadAttention` container, a pooling layer and a softmax head."""
    inputs = keras.Input((4, 8))
    attended = keras.layers.MultiHeadAttention(num_heads=1, key_dim=4, name="attention")(
        inputs, inputs
    )
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(attended)
    outputs = keras.layers.Dense(2, activation="softmax", name="head")(pooled)
    model = keras.Model(inputs, outputs, name="tiny_attention")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _count_trainings(monkeypatch, context, fail: bool = False) -> list:
    """Records each plan the context's evaluator trains (raising instead where `fail`)."""
    evaluator = context.evaluator
    original = evaluator.train_and_evaluate
    trained = []

    def train_and_evaluate(plan, *args, **kwargs):
        trained.append(plan)
        if fail:
            raise RuntimeError("out of memory for this plan")
        return original(plan, *args, **kwargs)

    monkeypatch.setattr(evaluator, "train_and_evaluate", train_and_evaluate)
    return trained


def _completed(study, context, label, assignment, value, violation=-1.0, train_steps=None):
    """Adds a completed, trained trial of `assignment` to `study` and returns it."""
    record = TrialRecord(
        warm_start=label,
        assignment=dict(assignment),
        assignment_key=assignment_key(assignment),
        train_steps=context.train_steps if train_steps is None else train_steps,
        predicted_seconds=value,
        fidelity=("profile", "train"),
        metrics={"val_accuracy": 1.0},
        metric=1.0,
        budget_violation=violation,
    )
    study.add_trial(
        optuna.trial.create_trial(
            value=value, user_attrs=record.to_user_attrs(), constraints={"budget": violation}
        )
    )
    return study.trials[-1]


def test_keras_global_policy_with_a_container_is_trained_once_and_judged_by_the_budget(
    monkeypatch,
):
    model = _tiny_attention()
    with prepared_search(model, labelled(model, 96, classes=2)) as prepared:
        context = prepared.context
        assert context.dtypes == ("float32", "bfloat16")
        trained = _count_trainings(monkeypatch, context)
        study = optuna.create_study()
        context.study = study
        finalists = add_finalists(context)

        expected = keras_global_plan(context, "bfloat16")
        assert len(trained) == 1 and trained[0].layers == expected.layers
        assert isinstance(finalists, Finalists) and finalists.same_as == {}
        assert set(finalists.trials) == {KERAS_BF16}  # no float16: not among the dtypes
        trial = study.trials[finalists.trials[KERAS_BF16]]
        record = TrialRecord.from_trial(trial)
        assert trial.state == optuna.trial.TrialState.COMPLETE
        assert record.warm_start == KERAS_BF16 and record.fidelity == ("profile", "train")
        assert record.assignment == dict(expected.layers) and "attention" in record.assignment
        assert record.assignment_key == assignment_key(expected.layers)
        assert record.train_steps == context.train_steps
        counted = {dtype: count for dtype, count in record.dtype_counts.items() if count}
        assert counted == {"bfloat16": len(context.compute)}  # counted on the compute layers
        # Judged as the objective judges a trial: the budget on the trained metric.
        assert record.metric == record.metrics[context.budget.log_name]
        violation = context.budget.violation(context.reference, record.metric)
        assert record.budget_violation == trial.constraints["budget"] == violation
        assert "output_floor" in trial.constraints  # the output rounding floor was judged too
        assert trial.value == pytest.approx(record.predicted_seconds)  # no trial of its compute
        assert finalist_plan(context, trial).layers == expected.layers
        # The only plan, within budget: the protections are dropped from it, but there is no
        # profile (bfloat16 only) to show their ranges fit.
        assert ranked_finalists(context, study) == ([trial] if violation <= 0 else [])
        assert finalists.base_trial == (trial.number if violation <= 0 else None)
        assert finalists.to_dict() == {
            "trials": {KERAS_BF16: trial.number},
            "same_as": {},
            "skipped": dict(finalists.skipped),
            "base_trial": finalists.base_trial,
        }

        again = add_finalists(context)  # a resumed study
        assert again == finalists and again.same_as == {}  # found as itself, not as a copy
        assert len(study.trials) == 1
        assert len(trained) == 1  # not trained twice


def test_a_keras_policy_outside_the_budget_is_added_but_never_a_base(monkeypatch):
    with prepared_search() as prepared:
        # A float32 reference of 2.0 accuracy: within a 0.5 drop, no plan meets the budget.
        context = dataclasses.replace(prepared.context, reference=2.0)
        trained = _count_trainings(monkeypatch, context)
        study = optuna.create_study()
        uniform = context.uniform_assignment("bfloat16")
        # The same compute plan, but trained for another number of steps: it does not count.
        other = _completed(
            study, context, "uniform bfloat16", uniform, 1.0, train_steps=context.train_steps + 1
        )
        context.study = study
        finalists = add_finalists(context)
        assert len(trained) == 1 and len(study.trials) == 2
        number = finalists.trials[KERAS_BF16]
        assert number != other.number and finalists.same_as == {}
        trial = study.trials[number]
        record = TrialRecord.from_trial(trial)
        assert trial.state == optuna.trial.TrialState.COMPLETE and record.metric is not None
        assert trial.constraints["budget"] == pytest.approx(context.reference - 0.5 - record.metric)
        assert trial.constraints["budget"] > 0 and record.budget_violation > 0
        # The compute plan is the other trial's: its objective value stands for this one.
        assert trial.value == other.value
        assert [t.number for t in ranked_finalists(context, study)] == [other.number]
        assert finalists.base_trial == other.number  # the only one within budget


def test_a_keras_policy_a_trial_already_ran_is_that_trial_and_not_trained_again(monkeypatch):
    with prepared_search() as prepared:
        context = prepared.context
        run_trials(context)
        records = {TrialRecord.from_trial(t).warm_start: t for t in context.study.trials}
        assert {"float32", "uniform bfloat16"} <= set(records)
        trained = _count_trainings(monkeypatch, context)
        before = len(context.study.trials)
        finalists = add_finalists(context)
        # The MLP has no container: Keras' mixed_bfloat16 is the uniform bfloat16 plan.
        assert finalists.trials[KERAS_BF16] == records["uniform bfloat16"].number
        assert finalists.same_as == {KERAS_BF16: "uniform bfloat16"}
        assert trained == [] and len(context.study.trials) == before

        # A trial without a warm start label stands for it too, named by its number.
        study = optuna.create_study()
        _completed(study, context, "float32", context.uniform_assignment("float32"), 2.0)
        plain = _completed(study, context, None, context.uniform_assignment("bfloat16"), 1.0)
        context.study = study
        again = add_finalists(context)
        assert again.trials[KERAS_BF16] == plain.number
        assert again.same_as == {KERAS_BF16: f"trial {plain.number}"}
        assert trained == [] and len(study.trials) == 2


def test_a_keras_policy_that_fails_to_train_is_skipped_with_the_reason(monkeypatch, caplog):
    with prepared_search(cost_batch_size=4096) as prepared:
        context = prepared.context
        context = dataclasses.replace(context, dtypes=("float32", "bfloat16", "float16"))
        trained = _count_trainings(monkeypatch, context, fail=True)
        study = optuna.create_study()
        with caplog.at_level(logging.WARNING, logger="autoprec"):
            context.study = study
            finalists = add_finalists(context)
        # float16 among the dtypes: mixed_float16 is a finalist too.
        assert [plan.layers for plan in trained] == [
            keras_global_plan(context, dtype).layers for dtype in ("bfloat16", "float16")
        ]
        assert finalists.trials == {} and study.trials == []
        for label in (KERAS_BF16, KERAS_F16):
            assert finalists.skipped[label] == (
                "training failed: RuntimeError: out of memory for this plan"
            )
            assert f"{label} could not be trained" in caplog.text
        assert finalists.skipped["protections"] == "no plan within budget"
        assert finalists.base_trial is None


def test_the_best_plan_with_a_protection_dropped_runs_through_the_trial_objective():
    model = compiled_mlp()
    train, val = mlp_data()
    prof = autoprec.profile(model, train, steps=2, batch_size=32, verbose=0)
    with prepared_search(model, (train, val), profile=prof) as prepared:
        context = prepared.context
        (head,) = sorted(context.outputs)
        assert context.profile is prof and prof.layers[head].bfloat16_safe
        first = context.compute[0]
        protected = {**context.uniform_assignment("float32"), first: "bfloat16"}
        study = optuna.create_study()
        base = _completed(study, context, "heuristic", protected, 1e-9)  # the cheapest
        uniform = _completed(
            study, context, "uniform bfloat16", context.uniform_assignment("bfloat16"), 1.0
        )
        ahead = context.normalise(
            {path: "float32" for path in context.compute} | {head: "bfloat16"}
        )
        (ahead_key,) = enqueue_candidates(
            study, [WarmStart("queued before", ahead, context.params_for(ahead))]
        )
        context.study = study
        finalists = add_finalists(context)

        assert finalists.base_trial == base.number
        assert finalists.trials[KERAS_BF16] == uniform.number  # no container: that trial
        label = dropped_label("outputs")
        dropped = study.trials[finalists.trials[label]]
        record = TrialRecord.from_trial(dropped)
        assert record.warm_start == label
        assert record.assignment == {**protected, head: "bfloat16"}
        assert dropped.state == optuna.trial.TrialState.COMPLETE
        assert record.metrics is not None and "budget" in dropped.constraints  # trained, judged
        assert finalists.skipped[dropped_label("softmax")] == "no softmax layer kept in float32"
        assert finalists.skipped[dropped_label("normalisation")] == (
            "no normalisation layer kept in float32"
        )
        # The trial queued before it ran first (Optuna's queue is first in, first out).
        (queued,) = [
            t for t in study.trials if TrialRecord.from_trial(t).assignment_key == ahead_key
        ]
        assert queued.state.is_finished() and queued.number < dropped.number
        assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))
