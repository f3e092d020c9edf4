"""The measured ranking's decision: `_core.rounds` with the search's finalists' simplicity.

Ties go to the simpler finalist (`candidates.simplicity`: float32, then Keras' global
policies and the uniform plans, the heuristic's, a plan with a protection dropped,
the searched plan). The rule itself (round-by-round differences against their own
noise) is `autoprec._core.rounds`, which the one-liner's timing inside `fit` shares.
"""

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
from .candidates import simplicity

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
    """Decides the measured ranking from the rounds: the fastest beyond noise, or a tie to the simplest.

    Args:
        rounds: `{name: seconds per step of each round}` of the timed finalists.

    Returns:
        The `RoundsVerdict` (`autoprec._core.rounds.judge_rounds` with `candidates.simplicity`).

    Raises:
        ValueError: `rounds` is empty or a plan has no round.

    Example:

    ```python
    verdict = judge_rounds({"searched": [0.90, 1.00, 1.20], "float32": [0.89, 1.05, 1.10]})
    verdict.leader, verdict.verdict  # ("float32", "tie")
    ```
    """
    return core_rounds.judge_rounds(rounds, simplicity)


def measured_ranking(rounds: Mapping[str, Sequence[float]]) -> list[str]:
    """Ranks timed plans from their rounds: `judge_rounds(rounds).order`.

    Args:
        rounds: `{name: seconds per step of each round}`.

    Returns:
        The names, first choice first.

    Example:

    ```python
    measured_ranking({"searched": [0.80, 0.81, 0.82], "float32": [0.90, 0.95, 0.97]})
    # ["searched", "float32"]: slower than the searched plan beyond the noise
    ```
    """
    return list(judge_rounds(rounds).order)


def next_rounds(
    rounds: Mapping[str, Sequence[float]],
    contenders: Sequence[str],
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int = MAX_ROUNDS,
) -> tuple[list[str], int]:
    """Chooses the contenders to time again and how many rounds, never past `max_rounds`.

    A contender that left the tie and rejoined it has fewer rounds than one that
    never left; each batch times the contenders still under `max_rounds`, in as many
    rounds as the most-timed of them has left (at most `min_rounds`).

    Args:
        rounds: `{name: seconds per step of each round}` so far.
        contenders: the plans within the noise of the fastest.
        min_rounds: the largest batch of rounds.
        max_rounds: rounds of a plan at most.

    Returns:
        `(names, rounds)`: the contenders to time and the rounds of the batch.

    Example:

    ```python
    next_rounds({"a": [1.0] * 10, "b": [1.0] * 5, "c": [1.0] * 15}, ["a", "b", "c"])
    # (["a", "b"], 5)
    ```
    """
    names = [name for name in contenders if len(rounds[name]) < max_rounds]
    if not names:
        return [], 0
    done = max(len(rounds[name]) for name in names)
    return names, min(min_rounds, max_rounds - done)
