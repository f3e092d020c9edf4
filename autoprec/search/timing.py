"""Timing plans' train steps on this device: interleaved rounds, more while undecided.

`measure_step_rounds` times each plan on its own compiled copy of the model in
rotating rounds; `measure_until_decided` adds rounds while the fastest plan is within
the noise of another (`rounds.py` judges), up to `MAX_ROUNDS` or a time cap.
"""

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
    """Times plans in interleaved rounds until the fastest is ahead beyond the noise, or a cap.

    Every plan is timed `min_rounds` rounds (`measure_step_rounds`: one compiled copy
    each, a warm-up of `ROUND_STEPS` steps, then rounds of `ROUND_STEPS` steps in a
    rotating order). While `judge_rounds` finds the fastest within the noise of
    another plan (`wants_more_rounds`), the contenders are timed again, in batches of
    at most `min_rounds` rounds, until `max_rounds` rounds or until another batch
    would end after `max_seconds`.

    Args:
        evaluator: the `Evaluator` whose model and first training batch are timed.
        plans: `{name: plan}`.
        min_rounds: rounds of every plan.
        max_rounds: rounds of a contender at most.
        max_seconds: seconds after which no batch of rounds is started.

    Returns:
        `{name: seconds per step of each round}`, in the order of `plans`.

    Example:

    ```python
    rounds = measure_until_decided(evaluator, {"float32": float32_plan, "searched": plan})
    judge_rounds(rounds).leader
    ```
    """
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
    """Times each plan's train step on this device in interleaved rounds: the fastest round.

    Each plan runs on its own compiled copy of the model, traced and warmed up once
    (5 steps); each round times 5 steps of every plan (their mean), the plans' order
    rotating from round to round so that none is always timed first; a plan's figure is
    its fastest round (`measure_step_rounds` gives them all).

    Args:
        evaluator: the `Evaluator` whose model and first training batch are timed.
        plans: the plans to time.
        rounds: how many times each plan is timed.

    Returns:
        Seconds per train step of each plan, in the order of `plans`.

    Example:

    ```python
    evaluator = Evaluator(model, train_batches, val_batches)
    float32, bfloat16 = measure_step_seconds(
        evaluator, [PrecisionPlan.uniform(model, "float32"), PrecisionPlan.uniform(model, "bfloat16")]
    )
    ```
    """
    return [min(figures) for figures in measure_step_rounds(evaluator, plans, rounds)]


def measure_step_rounds(
    evaluator: Evaluator, plans: Sequence[PrecisionPlan], rounds: int = 5
) -> list[list[float]]:
    """Times each plan's train step in interleaved, rotating rounds and returns every round.

    See `Evaluator.step_rounds`: one compiled copy per plan, nothing retraced between rounds.

    Args:
        evaluator: the `Evaluator` whose model and first training batch are timed.
        plans: the plans to time.
        rounds: how many times each plan is timed.

    Returns:
        For each plan, in the order of `plans`, its seconds per step in each round.

    Example:

    ```python
    figures = measure_step_rounds(evaluator, [float32_plan, mixed_plan], rounds=5)
    [min(f) for f in figures], [sorted(f)[2] for f in figures]  # fastest and median rounds
    ```
    """
    return evaluator.step_rounds(list(plans), rounds=rounds, steps=ROUND_STEPS)
