"""The measured ranking's decision: `_core.rounds` with the search's finalists' simplicity."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .._core import rounds as core_rounds
from .._core.rounds import (
    MAX_ROUNDS,
    MIN_ROUNDS,
    NOISE_FLOOR,
    SEPARATION,
    Comparison,
    RoundsVerdict,
    compare,
    wants_more_rounds,
)
from .record import simplicity

__all__ = [
    "MAX_ROUNDS",
    "MIN_ROUNDS",
    "NOISE_FLOOR",
    "SEPARATION",
    "Comparison",
    "RoundsVerdict",
    "compare",
    "judge_rounds",
    "measured_ranking",
    "next_rounds",
    "wants_more_rounds",
]


def judge_rounds(rounds: Mapping[str, Sequence[float]]) -> RoundsVerdict:
    """Decides the measured ranking from the rounds: the fastest beyond noise, or a tie to the
    simplest."""
    return core_rounds.judge_rounds(rounds, simplicity)


def measured_ranking(rounds: Mapping[str, Sequence[float]]) -> list[str]:
    """Ranks timed plans from their rounds: `judge_rounds(rounds).order`."""
    return list(judge_rounds(rounds).order)


def next_rounds(
    rounds: Mapping[str, Sequence[float]],
    contenders: Sequence[str],
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int = MAX_ROUNDS,
) -> tuple[list[str], int]:
    """Chooses the contenders to time again and how many rounds, never past `max_rounds`."""
    names = [name for name in contenders if len(rounds[name]) < max_rounds]
    if not names:
        return [], 0
    done = max(len(rounds[name]) for name in names)
    return names, min(min_rounds, max_rounds - done)
