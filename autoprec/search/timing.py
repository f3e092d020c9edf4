"""The search's evaluator copies timed through the engine of `_core.timing`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .._core.timing import MAX_ROUNDS, MIN_ROUNDS, time_until_decided
from ..plan import PrecisionPlan
from .evaluator import Evaluator
from .record import simplicity

#: Seconds the measured ranking may spend adding rounds after its first `MIN_ROUNDS`.
MEASUREMENT_SECONDS = 120.0
#: Steps of one timed round (and of the warm-up before the rounds).
ROUND_STEPS = 5


def measure_until_decided(
    evaluator: Evaluator,
    plans: Mapping[str, PrecisionPlan],
    *,
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int = MAX_ROUNDS,
    max_seconds: float = MEASUREMENT_SECONDS,
) -> dict[str, list[float]]:
    """Times plans in interleaved rounds until the fastest is ahead beyond the noise, or a cap."""
    return time_until_decided(
        lambda names, rounds: measure_step_rounds(evaluator, [plans[n] for n in names], rounds),
        list(plans),
        simplicity,
        min_rounds=min_rounds,
        max_rounds=max_rounds,
        max_seconds=max_seconds,
    )


def measure_step_seconds(
    evaluator: Evaluator, plans: Sequence[PrecisionPlan], rounds: int = 3
) -> list[float]:
    """Times each plan's train step on this device in interleaved rounds: the fastest round."""
    return [min(figures) for figures in measure_step_rounds(evaluator, plans, rounds)]


def measure_step_rounds(
    evaluator: Evaluator, plans: Sequence[PrecisionPlan], rounds: int = 5
) -> list[list[float]]:
    """Times each plan's train step in interleaved, rotating rounds and returns every round."""
    return evaluator.step_rounds(list(plans), rounds=rounds, steps=ROUND_STEPS)
