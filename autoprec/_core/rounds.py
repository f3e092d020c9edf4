"""The verdict on timed plans: which one leads, beyond the noise of its interleaved rounds."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

#: Interleaved rounds every finalist is timed at least (after a warm-up as long as a round).
MIN_ROUNDS = 5
#: Rounds at most: undecided plans are timed again in batches until then, then called a tie.
MAX_ROUNDS = 15
#: Standard errors of the round differences a plan must be slower by to count as slower.
SEPARATION = 2.5
#: The smallest difference that counts, as a fraction of the faster plan's median step.
NOISE_FLOOR = 0.01
#: Scale of the median absolute deviation to a normal standard deviation.
_MAD_SCALE = 1.4826


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One timed plan against the fastest, over the rounds both were timed in.

    Attributes:
        margin: the median over those rounds of (this plan's seconds - the fastest's):
            > 0 when this plan is slower.
        noise: the margin it must exceed to count as slower: `SEPARATION` standard
            errors of the round differences, at least `NOISE_FLOOR` of the fastest's
            median step.
        rounds: the rounds both plans were timed in.
    """

    margin: float
    noise: float
    rounds: int

    @property
    def separated(self) -> bool:
        """Whether this plan is slower than the fastest beyond the noise."""
        return self.margin > self.noise

    def to_dict(self) -> dict[str, Any]:
        """Returns the comparison as a JSON-ready dict."""
        return {
            "margin_seconds": self.margin,
            "noise_seconds": self.noise,
            "rounds": self.rounds,
            "separated": self.separated,
        }


def compare(fastest: Sequence[float], other: Sequence[float]) -> Comparison:
    """Compares one plan's rounds with the fastest plan's, round by round.

    The rounds are interleaved, so a round of one plan and the same round of the
    other ran under the same load: their differences cancel the load's drift. The
    noise is `SEPARATION` standard errors of the differences (their median absolute
    deviation, scaled to a standard deviation, over the square root of the rounds),
    and never less than `NOISE_FLOOR` of the fastest plan's median.

    Args:
        fastest: the fastest plan's seconds per round.
        other: the other plan's seconds per round (the rounds both have are compared).

    Returns:
        The `Comparison`.

    Example:

    ```python
    compare([1.00, 1.01, 0.99], [1.10, 1.12, 1.09]).separated  # True
    ```
    """
    count = min(len(fastest), len(other))
    if count == 0:
        return Comparison(0.0, math.inf, 0)
    base = np.asarray(fastest[:count], dtype=float)
    differences = np.asarray(other[:count], dtype=float) - base
    margin = float(np.median(differences))
    spread = _MAD_SCALE * float(np.median(np.abs(differences - margin)))
    noise = max(SEPARATION * spread / math.sqrt(count), NOISE_FLOOR * float(np.median(base)))
    return Comparison(margin, noise, count)


@dataclasses.dataclass(frozen=True)
class RoundsVerdict:
    """What the timed rounds decide."""

    order: tuple[str, ...]
    leader: str
    fastest: str
    contenders: tuple[str, ...]
    comparisons: Mapping[str, Comparison]
    medians: Mapping[str, float]
    rounds: Mapping[str, int]

    @property
    def decided(self) -> bool:
        """Whether the fastest is slower-than-noise ahead of every other plan (no tie)."""
        return len(self.contenders) == 1

    @property
    def verdict(self) -> str:
        """`"separated"` when decided, else `"tie"`."""
        return "separated" if self.decided else "tie"

    def to_dict(self) -> dict[str, Any]:
        """Returns the verdict as a JSON-ready dict (what `plan.metadata["search"]` keeps)."""
        return {
            "verdict": self.verdict,
            "leader": self.leader,
            "fastest": self.fastest,
            "contenders": list(self.contenders),
            "order": list(self.order),
            "median_seconds": dict(self.medians),
            "rounds_timed": dict(self.rounds),
            "against_fastest": {name: c.to_dict() for name, c in self.comparisons.items()},
            "separation": SEPARATION,
            "noise_floor": NOISE_FLOOR,
        }


def judge_rounds(
    rounds: Mapping[str, Sequence[float]], simplicity: Callable[[str], int]
) -> RoundsVerdict:
    """Decides from the rounds: the fastest plan beyond the noise, or a tie to the simplest."""
    empty = [name for name, figures in rounds.items() if len(figures) == 0]
    if not rounds or empty:
        raise ValueError(
            "judge_rounds needs at least one round of every plan; "
            f"{'no plan was timed' if not rounds else f'{empty[0]!r} has none'}."
        )
    medians = {name: float(np.median(figures)) for name, figures in rounds.items()}

    def contenders_among(pool: Sequence[str]) -> tuple[str, list[str], dict[str, Comparison]]:
        fastest = min(pool, key=lambda name: (medians[name], simplicity(name)))
        comparisons = {
            name: compare(rounds[fastest], rounds[name]) for name in pool if name != fastest
        }
        tied = [name for name, comparison in comparisons.items() if not comparison.separated]
        return fastest, [fastest, *tied], comparisons

    fastest, contenders, comparisons = contenders_among(list(rounds))
    leader = min(contenders, key=lambda name: (simplicity(name), medians[name]))
    order = [leader]
    pool = [name for name in rounds if name != leader]
    while pool:
        _, tied, _ = contenders_among(pool)
        chosen = min(tied, key=lambda name: (simplicity(name), medians[name]))
        order.append(chosen)
        pool.remove(chosen)
    return RoundsVerdict(
        order=tuple(order),
        leader=leader,
        fastest=fastest,
        contenders=tuple(contenders),
        comparisons=comparisons,
        medians=medians,
        rounds={name: len(figures) for name, figures in rounds.items()},
    )


def wants_more_rounds(verdict: RoundsVerdict, max_rounds: int = MAX_ROUNDS) -> bool:
    """Whether the contenders should be timed in more rounds: undecided, and under `max_rounds`."""
    if verdict.decided:
        return False
    return min(verdict.rounds[name] for name in verdict.contenders) < max_rounds
