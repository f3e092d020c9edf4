"""Tests for `autoprec.search.timing`: plans' train steps timed in interleaved rounds.

They run on a real small model and assert on the rounds' counts and decisions, never on
timings.
"""

from __future__ import annotations

from search.search_models import prepared_search

from autoprec._core.timing import MIN_ROUNDS, judge_rounds, wants_more_rounds
from autoprec.search import measure_step_rounds, measure_step_seconds
from autoprec.search.record import simplicity
from autoprec.search.timing import ROUND_STEPS, measure_until_decided


def test_measuring_adds_rounds_only_while_undecided_and_stops_at_the_time_cap():
    with prepared_search(hardware="local") as prepared:
        context = prepared.context
        plans = {
            "float32": context.float32_plan(),
            "uniform bfloat16": context.plan_for(context.uniform_assignment("bfloat16")),
        }
        rounds = measure_until_decided(context.evaluator, plans, max_rounds=8)
        assert set(rounds) == set(plans)
        counts = sorted(len(figures) for figures in rounds.values())
        assert counts[0] >= MIN_ROUNDS and counts[-1] <= 8
        if counts[-1] > MIN_ROUNDS:  # more rounds were added: the first five were a tie
            first = {name: figures[:MIN_ROUNDS] for name, figures in rounds.items()}
            assert wants_more_rounds(judge_rounds(first, simplicity), max_rounds=8)
        capped = measure_until_decided(context.evaluator, plans, max_seconds=0.0)
        assert [len(figures) for figures in capped.values()] == [MIN_ROUNDS, MIN_ROUNDS]


def test_every_plan_is_timed_in_every_round_and_its_figure_is_its_fastest_round():
    with prepared_search(hardware="local") as prepared:
        context = prepared.context
        plans = [context.float32_plan(), context.plan_for(context.uniform_assignment("bfloat16"))]
        rounds = measure_step_rounds(context.evaluator, plans, rounds=3)
        assert [len(figures) for figures in rounds] == [3, 3]
        assert all(seconds > 0 for figures in rounds for seconds in figures)
        fastest = measure_step_seconds(context.evaluator, plans, rounds=2)
        assert len(fastest) == 2 and all(seconds > 0 for seconds in fastest)
        assert ROUND_STEPS >= 1
