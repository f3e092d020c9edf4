"""Tests for `autoprec._core.timing`: the verdict on interleaved timing rounds, from plain numbers."""

from __future__ import annotations

import pytest

from autoprec._core.timing import MAX_ROUNDS, judge_rounds, margin_of, wants_more_rounds

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
