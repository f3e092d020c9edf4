"""Tests for `autoprec.search.settings`: the frozen SearchSettings and its refusals."""

from __future__ import annotations

import dataclasses

import pytest

import autoprec
from autoprec.errors import AutoprecError
from autoprec.search import SearchSettings


def test_settings_are_frozen_printable_and_round_trip():
    settings = SearchSettings(batch_size=64, steps_per_trial=40, dtypes=["float32", "bfloat16"])
    assert settings.dtypes == ("float32", "bfloat16")  # lists become tuples: hashable, frozen
    assert "steps_per_trial=40" in repr(settings)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.batch_size = 8
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
