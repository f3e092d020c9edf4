"""Tests for `autoprec.search.context`: settings, the stage clock, and a real search's context."""

from __future__ import annotations

import dataclasses
import logging
import time

import keras
import optuna
import pytest
from search.search_models import far_regression, far_targets, prepared_search

import autoprec
from autoprec.errors import AutoprecError
from autoprec.search import Budget, SearchSettings, TrialRecord
from autoprec.search.context import StageClock
from autoprec.search.result import assignment_key


def test_assignments_params_and_plans_agree():
    with prepared_search() as prepared:
        context = prepared.context
        compute = context.compute
        assert context.train_steps == context.fidelity.train_steps == 2
        assert context.normalise({}) == {path: "float32" for path in compute}
        uniform = context.uniform_assignment("bfloat16")
        assert set(uniform) == set(compute) and set(uniform.values()) == {"bfloat16"}
        params = context.params_for(uniform)
        assert context.assignment(params) == uniform
        assert dict(context.float32_plan().layers).items() >= context.normalise({}).items()
        # the float32 reference is in the cache, under the float32 assignment's key
        cached = context.cache[assignment_key(context.uniform_assignment("float32"))]
        assert cached.reused_from == "reference" and context.budget.log_name in cached.metrics


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


def test_the_output_floor_is_measured_once_per_set_of_16_bit_outputs():
    keras.utils.set_random_seed(0)
    budget = Budget("val_loss", max_relative_drop=0.02)
    with prepared_search(far_regression(), far_targets(), budget) as prepared:
        context = prepared.context
        assert context.output_paths == ("head",)
        uniform = context.uniform_assignment("bfloat16")
        floor = context.output_floor(uniform)
        assert floor.refused and floor.value == pytest.approx(1.81, rel=0.05)  # these targets
        assert floor.reference == context.reference
        # Another plan with the same 16-bit head shares the measured floor.
        assert context.output_floor({**uniform, "wide1": "float32"}) is floor
        assert context.output_floor({**uniform, "head": "float32"}) is None
        assert list(context.floors) == [(("head", "bfloat16"),)]
        assert context.floor_evidence()["head"]["bfloat16"]["value"] == floor.value


def test_a_floor_that_cannot_be_measured_refuses_nothing_and_says_so(caplog):
    budget = Budget("val_loss", max_relative_drop=0.02)
    with prepared_search(budget=budget) as prepared:
        context = prepared.context
        context.budget = Budget("val_not_a_metric", max_drop=0.1, mode="min")
        with caplog.at_level(logging.WARNING, logger="autoprec"):
            assert context.output_floor(context.uniform_assignment("bfloat16")) is None
        assert "could not be measured" in caplog.text and "val_not_a_metric" in caplog.text


def test_settings_are_printable_and_round_trip():
    settings = SearchSettings(batch_size=64, steps_per_trial=40, dtypes=["float32", "bfloat16"])
    assert settings.dtypes == ("float32", "bfloat16")  # lists become tuples: hashable, frozen
    assert "steps_per_trial=40" in repr(settings)
    assert SearchSettings.from_config(settings.get_config()) == settings
    assert dataclasses.replace(settings, seed=3).seed == 3
    assert settings.longest_steps_per_trial == 320
    assert SearchSettings(max_steps_per_trial=50).longest_steps_per_trial == 50
    assert autoprec.SearchSettings is SearchSettings


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"batch_size": 0}, "SearchSettings.batch_size must be a positive integer"),
        ({"steps_per_trial": True}, "steps_per_trial must be a positive integer"),
        ({"validation_steps": -1}, "validation_steps must be a positive integer"),
        ({"confirm_steps": -2}, "confirm_steps must be an integer >= 0"),
        ({"dtypes": ["float64"]}, "each must be one of float32"),
        ({"group_by": "module"}, "use 'layer', 'block', 'auto'"),
        ({"baseline": "chance"}, "use 'auto', a number, or None"),
        ({"float16_trials": "fast"}, "float16_trials='fast': use 'auto', 'native', 'emulated'"),
        ({"profile": "profile.json"}, "autoprec.Profile.load"),
        ({"costs": {"dense": 1.0}}, "CostTable.load"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(changes, words):
    with pytest.raises(AutoprecError, match=words.replace("(", r"\(")):
        SearchSettings(**changes)


def test_unknown_config_keys_are_refused():
    with pytest.raises(AutoprecError, match=r"unknown field\(s\) \['train_steps'\]"):
        SearchSettings.from_config({"train_steps": 4})


def test_the_clock_adds_up_each_stage_even_when_it_raises():
    clock = StageClock()
    for _ in range(2):
        with clock.stage("trials"):
            time.sleep(0.01)
    with pytest.raises(KeyboardInterrupt), clock.stage("confirmation"):
        raise KeyboardInterrupt
    assert clock.seconds["trials"] >= 0.02 and set(clock.seconds) == {"trials", "confirmation"}
