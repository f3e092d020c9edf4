"""Interleaved timing rounds: every contender timed in each round, in an order that rotates.

On a shared, noisy machine what one contender's round goes through (load, clock
frequency, caches) the others go through in the same round, so their ratios
compare. Each contender first runs one untimed round (the warm-up: as long as a
timed round, and it traces or compiles); the figures of a contender are its
rounds' mean step times, reported as their minimum and median (at least
`MIN_ROUNDS` rounds to judge by).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

#: Fewer interleaved rounds than this are not conclusive.
MIN_ROUNDS = 5
#: What a benchmark reports of its rounds.
STATISTICS = ("min", "median")
#: The keys `milliseconds` writes by default.
MS_KEYS = ("ms_min", "ms_median", "rounds_ms")

T = TypeVar("T")


def interleave(
    runs: Mapping[str, Callable[[], T]], rounds: int, limits: Mapping[str, int] | None = None
) -> dict[str, list[T]]:
    """Calls every run once per round, in an order rotated by one from round to round.

    Args:
        runs: `{name: function}`; each call is one round of that contender.
        rounds: how many rounds.
        limits: at most that many rounds for a contender named there (a slow one sits
            out the rest).

    Returns:
        `{name: [what each of its calls returned, in order]}`.
    """
    names = list(runs)
    results: dict[str, list[T]] = {name: [] for name in names}
    for index in range(rounds if names else 0):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            if limits is not None and len(results[name]) >= limits.get(name, rounds):
                continue
            results[name].append(runs[name]())
    return results


def time_rounds(
    runs: Mapping[str, Callable[[], T]],
    rounds: int,
    on_failure: Callable[[str, Exception], None] | None = None,
) -> dict[str, list[T]]:
    """One untimed round of each run (the warm-up), then `rounds` interleaved rounds.

    A run that raises in its warm-up is passed with its error to `on_failure` (called
    inside the `except`, so the traceback is at hand) and left out; without
    `on_failure` the error propagates.
    """
    ready: dict[str, Callable[[], T]] = {}
    for name, run in runs.items():
        try:
            run()
        except Exception as error:
            if on_failure is None:
                raise
            on_failure(name, error)
            continue
        ready[name] = run
    return interleave(ready, rounds)


def time_steps(
    steps: Mapping[str, Callable[[], Any]],
    rounds: int,
    steps_per_round: int,
    on_failure: Callable[[str, Exception], None] | None = None,
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Mean seconds per step of each step function, per round, in rotating interleaved rounds.

    Each function first runs `steps_per_round` untimed steps (the warm-up); see
    `time_rounds` for one that fails there.

    Returns:
        `({name: [seconds per step of each round]}, {name: what its last step returned})`.
    """
    last: dict[str, Any] = {}

    def round_of(name: str, step: Callable[[], Any]) -> Callable[[], float]:
        def run() -> float:
            started = time.perf_counter()
            for _ in range(steps_per_round):
                last[name] = step()
            return (time.perf_counter() - started) / steps_per_round

        return run

    runs = {name: round_of(name, step) for name, step in steps.items()}
    return time_rounds(runs, rounds, on_failure), last


def spread(values: Sequence[float]) -> dict[str, float]:
    """`{"min", "median"}` of per-round figures."""
    return {"min": min(values), "median": statistics.median(values)}


def milliseconds(seconds: Sequence[float], keys: tuple[str, str, str] = MS_KEYS) -> dict[str, Any]:
    """Per-round seconds as `{"ms_min", "ms_median", "rounds_ms"}` (or the given `keys`)."""
    low, middle, every = keys
    return {
        low: min(seconds) * 1e3,
        middle: statistics.median(seconds) * 1e3,
        every: [value * 1e3 for value in seconds],
    }


def fastest(
    candidates: Mapping[str, Mapping[str, Any]], names: Iterable[str]
) -> dict[str, str | None]:
    """Per statistic, which of `names` has the smallest `ms_<statistic>` (`None`: none timed).

    Only candidates with figures (`"ms_min"`) count, taken in the order of `candidates`.
    """
    wanted = set(names)
    timed = [name for name, figures in candidates.items() if name in wanted and "ms_min" in figures]
    return {
        statistic: (
            min(timed, key=lambda name: candidates[name][f"ms_{statistic}"]) if timed else None
        )
        for statistic in STATISTICS
    }


def ratios_to(
    figures: Mapping[str, Any],
    candidates: Mapping[str, Mapping[str, Any]],
    best: Mapping[str, str | None],
) -> dict[str, float]:
    """`figures`' `ms_<statistic>` over the best candidate's, per statistic."""
    return {
        statistic: figures[f"ms_{statistic}"] / candidates[best[statistic]][f"ms_{statistic}"]
        for statistic in STATISTICS
    }


def geometric_mean(values: Sequence[float]) -> float | None:
    """The geometric mean of positive `values` (`None` for none)."""
    return math.exp(statistics.fmean(math.log(value) for value in values)) if values else None
