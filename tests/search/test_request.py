"""Tests for `autoprec.search.request`: the stage clock and the frozen request."""

from __future__ import annotations

import dataclasses
import time

import pytest
from search.search_models import prepared_search

from autoprec.search.settings import StageClock


def test_the_clock_adds_up_each_stage_even_when_it_raises():
    clock = StageClock()
    for _ in range(2):
        with clock.stage("trials"):
            time.sleep(0.01)
    with pytest.raises(KeyboardInterrupt), clock.stage("confirmation"):
        raise KeyboardInterrupt
    assert clock.seconds["trials"] >= 0.02 and set(clock.seconds) == {"trials", "confirmation"}


def test_a_request_is_frozen_and_carries_its_clock():
    with prepared_search() as prepared:
        request = prepared.request
        with pytest.raises(dataclasses.FrozenInstanceError):
            request.n_trials = 5
        assert isinstance(request.clock, StageClock)
        assert request.max_train_steps == 16
