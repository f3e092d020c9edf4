"""Tests for `autoprec.search.context`: assignments, params and plans of a real search's context."""

from __future__ import annotations

import optuna
from search.search_models import prepared_search

from autoprec.search import TrialRecord
from autoprec.search.record import assignment_key


def test_assignments_params_and_plans_agree():
    with prepared_search() as prepared:
        context = prepared.context
        compute = context.compute
        assert context.train_steps == prepared.reference.fidelity.train_steps == 2
        assert context.normalise({}) == {path: "float32" for path in compute}
        uniform = context.uniform_assignment("bfloat16")
        assert set(uniform) == set(compute) and set(uniform.values()) == {"bfloat16"}
        params = context.params_for(uniform)
        assert context.assignment(params) == uniform
        assert dict(context.float32_plan().layers).items() >= context.normalise({}).items()
        # the float32 reference is in the cache, under the float32 assignment's key
        cached = context.cache[assignment_key(context.uniform_assignment("float32"))]
        assert cached.trial == "reference" and context.budget.log_name in cached.metrics


def test_a_trial_s_assignment_is_its_record_s_else_its_params():
    with prepared_search(group_by=1) as prepared:
        context = prepared.context
        study = optuna.create_study()
        first = context.compute[0]
        stored = {first: "bfloat16"}  # the rest float32, whatever the params say
        study.add_trial(
            optuna.trial.create_trial(
                value=1.0, user_attrs=TrialRecord(assignment=stored).to_user_attrs()
            )
        )
        sampled = context.params_for(context.uniform_assignment("bfloat16"))
        distributions = {
            name: optuna.distributions.CategoricalDistribution(["float32", "bfloat16"])
            for name in sampled
        }
        study.add_trial(
            optuna.trial.create_trial(value=1.0, params=sampled, distributions=distributions)
        )
        with_record, with_params = study.trials
        assert context.trial_assignment(with_record) == context.normalise(stored)
        assert not context.is_float32(with_record)
        assert context.trial_assignment(with_params) == context.uniform_assignment("bfloat16")
        assert dict(context.trial_plan(with_record).layers)[first] == "bfloat16"
