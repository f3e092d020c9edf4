"""Timing plans' train steps on this device: interleaved rounds, more while undecided."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from ..plan import PrecisionPlan
from .evaluator import Evaluator
from .rounds import MAX_ROUNDS, MIN_ROUNDS, judge_rounds, next_rounds, wants_more_rounds

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
    started = time.perf_counter()
    names = list(plans)
    figures = measure_step_rounds(evaluator, [plans[name] for name in names], rounds=min_rounds)
    rounds = {name: list(values) for name, values in zip(names, figures)}
    batch_seconds, batch_plans = time.perf_counter() - started, len(names)
    while True:
        verdict = judge_rounds(rounds)
        if not wants_more_rounds(verdict, max_rounds):
            return rounds
        contenders, batch = next_rounds(rounds, verdict.contenders, min_rounds, max_rounds)
        if len(contenders) < 2:
            return rounds
        estimate = batch_seconds * len(contenders) / max(batch_plans, 1)
        if time.perf_counter() - started + estimate > max_seconds:
            return rounds
        batch_started = time.perf_counter()
        more = measure_step_rounds(evaluator, [plans[name] for name in contenders], rounds=batch)
        for name, values in zip(contenders, more):
            rounds[name].extend(values)
        batch_seconds, batch_plans = time.perf_counter() - batch_started, len(contenders)


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
