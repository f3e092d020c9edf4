"""The one whole-step timing engine (autoprec/_core/timing.py): the interleaved timer and the
verdict on its rounds, from plain numbers."""

from __future__ import annotations

import time

import pytest

from autoprec._core.timing import (
    MAX_ROUNDS,
    Timing,
    judge_rounds,
    margin_of,
    rounds_needed,
    time_interleaved,
    wants_more_rounds,
)


def test_every_function_is_timed_each_round_after_its_warm_up():
    calls = {"a": 0, "b": 0}

    def counter(name):
        def call():
            calls[name] += 1

        return call

    timings = time_interleaved({"a": counter("a"), "b": counter("b")}, rounds=5, warmup=2)
    assert calls == {"a": 7, "b": 7}
    assert [len(timing.samples) for timing in timings.values()] == [5, 5]


def test_rounds_rotate_the_order():
    order = []
    functions = {name: (lambda name=name: order.append(name)) for name in "abc"}
    time_interleaved(functions, rounds=3, warmup=1)
    assert order[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_a_slow_function_is_timed_apart_and_fewer_times():
    order = []

    def fast():
        order.append("fast")

    def slow():
        order.append("slow")
        time.sleep(0.02)

    timings = time_interleaved(
        {"slow": slow, "fast": fast}, rounds=4, warmup=1, slow_factor=10, slow_rounds=1
    )
    assert len(timings["fast"].samples) == 4
    assert len(timings["slow"].samples) == 1
    assert order[2:] == ["fast"] * 4 + ["slow"]
    assert timings["slow"].minimum > timings["fast"].median


def test_timing_statistics():
    timing = Timing((3.0, 1.0, 2.0))
    assert timing.median == 2.0
    assert timing.minimum == 1.0
    with pytest.raises(AttributeError):
        timing.samples = ()


ORDER = ["float32", "mixed_bfloat16", "per-layer"]


def test_a_plan_faster_beyond_the_noise_leads():
    verdict = judge_rounds(
        {
            "float32": [1.00, 1.01, 1.02, 1.00, 1.01],
            "mixed_bfloat16": [0.95, 0.96, 0.97, 0.95, 0.96],
            "per-layer": [0.70, 0.71, 0.72, 0.70, 0.71],
        },
        ORDER.index,
    )
    assert verdict.leader == verdict.fastest == "per-layer"
    assert verdict.decided and verdict.verdict == "separated"
    assert verdict.order == ("per-layer", "mixed_bfloat16", "float32")


def test_a_difference_inside_the_noise_goes_to_the_simpler_plan():
    # The round-by-round differences swing between -15 % and +15 %: no separation.
    verdict = judge_rounds(
        {"float32": [1.00, 0.90, 1.10, 1.00, 0.95], "per-layer": [0.90, 1.05, 0.95, 1.02, 0.93]},
        ORDER.index,
    )
    assert verdict.fastest == "per-layer"
    assert verdict.leader == "float32"
    assert verdict.verdict == "tie"
    assert wants_more_rounds(verdict)


def test_a_gain_below_the_noise_floor_is_a_tie_even_in_quiet_rounds():
    comparison = margin_of([1.0, 1.0, 1.0], [1.005, 1.005, 1.005])
    assert not comparison.separated
    verdict = judge_rounds({"float32": [1.005] * 5, "per-layer": [1.0] * 5}, ORDER.index)
    assert verdict.leader == "float32"


def test_simplicity_decides_among_tied_plans():
    rounds = {"float32": [1.0] * 5, "mixed_bfloat16": [0.80] * 5, "per-layer": [0.799] * 5}
    assert judge_rounds(rounds, ORDER.index).leader == "mixed_bfloat16"
    # The caller says what is simple.
    assert judge_rounds(rounds, {"per-layer": 0, "mixed_bfloat16": 1, "float32": 2}.get).leader == (
        "per-layer"
    )


def test_more_rounds_are_wanted_only_while_undecided_and_under_the_cap():
    tied = {"float32": [1.0, 0.9, 1.1], "per-layer": [0.95, 1.0, 0.97]}
    assert wants_more_rounds(judge_rounds(tied, ORDER.index))
    capped = {name: figures * MAX_ROUNDS for name, figures in tied.items()}
    assert not wants_more_rounds(judge_rounds(capped, ORDER.index))
    assert not wants_more_rounds(
        judge_rounds({"float32": [1.0] * 5, "per-layer": [0.5] * 5}, ORDER.index)
    )


def test_a_plan_without_rounds_is_an_error():
    with pytest.raises(ValueError, match="'per-layer' has none"):
        judge_rounds({"float32": [1.0], "per-layer": []}, ORDER.index)


def test_a_sign_test_asks_the_fastest_to_win_enough_rounds():
    assert [rounds_needed(n) for n in (3, 4, 5, 20)] == [None, None, 5, 15]
    # Faster by 30 % in the median round, beyond the noise, but in only 12 of 20 rounds.
    rounds = {"float32": [26.0] * 12 + [25.0] * 8, "per-layer": [20.0] * 12 + [30.0] * 8}
    assert judge_rounds(rounds, ORDER.index).decided
    verdict = judge_rounds(rounds, ORDER.index, significance=0.05)
    assert verdict.leader == "float32" and not verdict.decided
    comparison = verdict.comparisons["float32"]
    assert (comparison.won, comparison.rounds, comparison.needed) == (12, 20, 15)
    won = {"float32": [26.0] * 17 + [25.0] * 3, "per-layer": [20.0] * 17 + [30.0] * 3}
    assert judge_rounds(won, ORDER.index, significance=0.05).leader == "per-layer"
    few = {"float32": [2.0] * 4, "per-layer": [1.0] * 4}  # 4 rounds cannot show a difference
    assert judge_rounds(few, ORDER.index, significance=0.05).verdict == "tie"


def test_the_caller_may_raise_the_noise_floor():
    rounds = {"float32": [1.04] * 5, "per-layer": [1.0] * 5}
    assert judge_rounds(rounds, ORDER.index).leader == "per-layer"
    assert judge_rounds(rounds, ORDER.index, noise_floor=0.05).leader == "float32"
