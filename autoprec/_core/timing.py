"""The one whole-step timing engine: interleaved rotating rounds, their noise and the verdict, for
compiled clones (`cost.steps`), the search's copies and live steps inside `fit` (`decision.race`)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

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
MAD_SCALE = 1.4826
#: One-sided significance of the sign test `judge_rounds(significance=...)` adds to the noise.
SIGNIFICANCE = 0.05

_Item = TypeVar("_Item")


def spread(values: Sequence[float]) -> float:
    """Median absolute deviation of `values`, scaled to a normal standard deviation."""
    array = np.asarray(values, dtype=float)
    return MAD_SCALE * float(np.median(np.abs(array - np.median(array))))


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds of each timed call of one function."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        """Median seconds of one call."""
        return float(np.median(self.samples))

    @property
    def minimum(self) -> float:
        """Fastest call's seconds."""
        return float(min(self.samples))

    @property
    def spread(self) -> float | None:
        """Spread of the calls' seconds (`None`: one call)."""
        return spread(self.samples) if len(self.samples) >= 2 else None


def rotated(items: Sequence[_Item], round_index: int) -> list[_Item]:
    """Returns `items` in the order of round `round_index`: each round starts one further on."""
    shift = round_index % len(items) if items else 0
    return [*items[shift:], *items[:shift]]


def _timed_call(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def time_interleaved(
    functions: Mapping[str, Callable[[], object]],
    rounds: int,
    warmup: int = 1,
    slow_seconds: float | None = None,
    slow_factor: float | None = None,
    slow_rounds: int = 2,
) -> dict[str, Timing]:
    """Times several functions in alternating rounds whose order rotates."""
    warm: dict[str, float] = {}
    for name, function in functions.items():
        for _ in range(max(warmup - 1, 0)):
            function()
        warm[name] = _timed_call(function)
    limit = math.inf if slow_seconds is None else slow_seconds
    if slow_factor is not None:
        limit = min(limit, slow_factor * min(warm.values(), default=0.0))
    fast = [name for name in functions if warm[name] <= limit]
    samples: dict[str, list[float]] = {name: [] for name in functions}
    for round_index in range(max(rounds, 1)):
        for name in rotated(fast, round_index):
            samples[name].append(_timed_call(functions[name]))
    for name in functions:
        if name not in fast:
            samples[name] = [_timed_call(functions[name]) for _ in range(max(slow_rounds, 1))]
    return {name: Timing(tuple(values)) for name, values in samples.items()}


def rounds_needed(rounds: int, significance: float = SIGNIFICANCE) -> int | None:
    """Returns the fewest of `rounds` paired rounds a plan must win to be called faster (a one-sided
    sign test); `None` where all would not do."""
    for wins in range(rounds + 1):
        if sum(math.comb(rounds, k) for k in range(wins, rounds + 1)) < significance * 2**rounds:
            return wins
    return None


@dataclasses.dataclass(frozen=True)
class Margin:
    """One plan's median round-by-round margin on the fastest (> 0: slower), the noise it must exceed,
    and the rounds the fastest won of the `needed` (0: no sign test; `None`: too few rounds)."""

    margin: float
    noise: float
    rounds: int
    won: int = 0
    needed: int | None = 0

    @property
    def separated(self) -> bool:
        """Whether this plan is slower than the fastest beyond the noise (and the sign test)."""
        return self.margin > self.noise and self.needed is not None and self.won >= self.needed

    def to_dict(self) -> dict[str, Any]:
        """Returns the comparison as a JSON-ready dict."""
        return {
            "margin_seconds": self.margin,
            "noise_seconds": self.noise,
            "rounds": self.rounds,
            "separated": self.separated,
        }


def margin_of(
    fastest: Sequence[float],
    other: Sequence[float],
    noise_floor: float = NOISE_FLOOR,
    significance: float | None = None,
) -> Margin:
    """Compares one plan's rounds with the fastest's, round by round: interleaved rounds ran
    under the same load, so their differences cancel its drift."""
    count = min(len(fastest), len(other))
    if count == 0:
        return Margin(0.0, math.inf, 0)
    base = np.asarray(fastest[:count], dtype=float)
    differences = np.asarray(other[:count], dtype=float) - base
    noise = max(
        SEPARATION * spread(differences) / math.sqrt(count), noise_floor * float(np.median(base))
    )
    needed = 0 if significance is None else rounds_needed(count, significance)
    won = int(np.sum(differences > 0))
    return Margin(float(np.median(differences)), noise, count, won, needed)


@dataclasses.dataclass(frozen=True)
class RoundsVerdict:
    """What the timed rounds decide."""

    order: tuple[str, ...]
    leader: str
    fastest: str
    contenders: tuple[str, ...]
    comparisons: Mapping[str, Margin]
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
    rounds: Mapping[str, Sequence[float]],
    simplicity: Callable[[str], int],
    *,
    noise_floor: float = NOISE_FLOOR,
    significance: float | None = None,
) -> RoundsVerdict:
    """Decides from the rounds: the fastest plan beyond the noise (at least `noise_floor` of its
    median step, and winning a sign test at `significance` if given), or a tie to the simplest."""
    empty = [name for name, figures in rounds.items() if len(figures) == 0]
    if not rounds or empty:
        raise ValueError(
            "judge_rounds needs at least one round of every plan; "
            f"{'no plan was timed' if not rounds else f'{empty[0]!r} has none'}."
        )
    medians = {name: float(np.median(figures)) for name, figures in rounds.items()}

    def contenders_among(pool: Sequence[str]) -> tuple[str, list[str], dict[str, Margin]]:
        fastest = min(pool, key=lambda name: (medians[name], simplicity(name)))
        comparisons = {
            name: margin_of(rounds[fastest], rounds[name], noise_floor, significance)
            for name in pool
            if name != fastest
        }
        tied = [name for name, comparison in comparisons.items() if not comparison.separated]
        return fastest, [fastest, *tied], comparisons

    order, pool = [], list(rounds)
    while pool:  # the simplest of the plans tied with the fastest, then the same among the rest
        _, tied, _ = contenders_among(pool)
        order.append(min(tied, key=lambda name: (simplicity(name), medians[name])))
        pool.remove(order[-1])
    fastest, contenders, comparisons = contenders_among(list(rounds))
    return RoundsVerdict(
        order=tuple(order),
        leader=order[0],
        fastest=fastest,
        contenders=tuple(contenders),
        comparisons=comparisons,
        medians=medians,
        rounds={name: len(figures) for name, figures in rounds.items()},
    )


def wants_more_rounds(verdict: RoundsVerdict, max_rounds: int = MAX_ROUNDS) -> bool:
    """Whether the contenders should be timed in more rounds: undecided, and under `max_rounds`."""
    return not verdict.decided and min(verdict.rounds[n] for n in verdict.contenders) < max_rounds


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


def time_until_decided(
    time_rounds: Callable[[list[str], int], Sequence[Sequence[float]]],
    names: Sequence[str],
    simplicity: Callable[[str], int],
    *,
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int = MAX_ROUNDS,
    max_seconds: float = math.inf,
) -> dict[str, list[float]]:
    """Times `names` in interleaved rounds (`time_rounds(names, rounds)`) until the fastest
    leads beyond the noise, or a cap."""
    started = time.perf_counter()
    names = list(names)
    rounds = {name: list(values) for name, values in zip(names, time_rounds(names, min_rounds))}
    batch_seconds, batch_plans = time.perf_counter() - started, len(names)
    while True:
        contenders = judge_rounds(rounds, simplicity).contenders  # decided: the fastest alone
        contenders, batch = next_rounds(rounds, contenders, min_rounds, max_rounds)
        if len(contenders) < 2:
            return rounds
        estimate = batch_seconds * len(contenders) / max(batch_plans, 1)
        if time.perf_counter() - started + estimate > max_seconds:
            return rounds
        batch_started = time.perf_counter()
        for name, values in zip(contenders, time_rounds(contenders, batch)):
            rounds[name].extend(values)
        batch_seconds, batch_plans = time.perf_counter() - batch_started, len(contenders)
