"""What the search does after its trials: time the best plans here, confirm the chosen one.

The measured step has the last word over predicted costs (`order_by_measurement`), and a
plan chosen at a low fidelity or by a close margin is trained again for longer, against
float32 trained as long, before it is returned (`confirm_plan`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import optuna

from .._core.dtypes import FLOAT32
from .._core.messages import show_message
from ..plan import PrecisionPlan
from .evaluator import Evaluator
from .fidelity import confirmation_reasons, longer_batches
from .study import SearchContext

logger = logging.getLogger("autoprec")

#: Interleaved timing rounds of that comparison.
MEASURED_ROUNDS = 5
#: Plans confirmed at the higher fidelity, down the ranking, before falling back to float32.
CONFIRMATION_ATTEMPTS = 3


def say(verbose: int, text: str, *arguments: object) -> None:
    """Shows one progress line (`text % arguments`) when `verbose` asks for it."""
    if verbose:
        show_message(text % arguments)


def order_by_measurement(
    context: SearchContext, ranked: list[optuna.trial.FrozenTrial]
) -> tuple[
    list[optuna.trial.FrozenTrial],
    dict[str, float],
    dict[str, list[float]],
    dict[int, str],
    tuple[str, int] | None,
]:
    """Times the searched plan beside float32 and every warm start within budget, interleaved.

    Per-layer costs can rank a mixed plan ahead of a uniform one that the whole
    step runs faster; the measured step has the last word. The timed plans are
    ranked by `measured_ranking`: first the simplest plan (float32, then the uniform
    16-bit plans, then the heuristic's, then the searched one) that no other plan
    beats in both its median and its fastest round, so a split decision, which is
    noise, goes to the simpler plan, never to a mixed plan that may be slower. The
    confirmation falls back down this ranking; plans not timed follow, by predicted
    cost.

    Returns:
        `(ranked trials, reordered; {name: fastest round's seconds}; {name: every round's
        seconds}; {trial number: name}; (label, trial number) of the warm start that
        replaced the searched plan, or None)`.
    """
    best = ranked[0]
    float32_trial = next((trial for trial in ranked if is_float32(context, trial)), None)
    candidates: dict[str, tuple[PrecisionPlan, optuna.trial.FrozenTrial | None]] = {
        "searched": (context.trial_plan(best), best),
        "float32": (context.plan_for(context.uniform_assignment(FLOAT32)), float32_trial),
    }
    for trial in ranked[1:]:
        label = str(trial.user_attrs.get("warm_start", ""))
        if label and label != "float32" and label not in candidates:
            candidates[label] = (context.trial_plan(trial), trial)
    names = list(candidates)
    rounds = measure_step_rounds(
        context.evaluator, [candidates[name][0] for name in names], rounds=MEASURED_ROUNDS
    )
    by_name = {name: list(figures) for name, figures in zip(names, rounds)}
    timed = {name: min(figures) for name, figures in by_name.items()}
    numbers = {trial.number: name for name, (_, trial) in candidates.items() if trial is not None}
    order = measured_ranking(by_name)
    if order[0] != "searched":
        say(
            context.verbose,
            "autoprec.search: the searched plan did not measure faster than %s (median %.4g ms "
            "against %.4g ms, fastest %.4g ms against %.4g ms); using %s.",
            order[0],
            1e3 * float(np.median(by_name["searched"])),
            1e3 * float(np.median(by_name[order[0]])),
            1e3 * timed["searched"],
            1e3 * timed[order[0]],
            order[0],
        )
    reordered: list[optuna.trial.FrozenTrial] = []
    for name in order:
        trial = candidates[name][1]
        if trial is None:  # float32, not among the trials (a study resumed at another fidelity)
            break
        if all(trial.number != other.number for other in reordered):
            reordered.append(trial)
    if order[0] == "float32" and float32_trial is None:
        return [], timed, by_name, numbers, None
    timed_numbers = {trial.number for _, trial in candidates.values() if trial is not None}
    reordered += [trial for trial in ranked if trial.number not in timed_numbers]
    replaced = None
    if order[0] != "searched" and reordered and reordered[0].number != best.number:
        replaced = (order[0], reordered[0].number)
    return reordered, timed, by_name, numbers, replaced


#: Which timed plan is simpler, for `measured_ranking`'s ties (lower is simpler).
_SIMPLICITY = {"float32": 0, "uniform bfloat16": 1, "uniform float16": 1, "heuristic": 2}


def measured_ranking(rounds: Mapping[str, Sequence[float]]) -> list[str]:
    """Ranks timed plans: the simplest plan that no other beats in both its median and fastest round.

    A plan clearly beats another when both its median and its fastest round are
    faster. Among the plans no other clearly beats, the simplest goes first (float32,
    then uniform 16-bit, then the heuristic's, then others, then the searched plan;
    among equals the fastest median): a split decision is noise, and noise goes to
    the simpler plan. The rest are ranked the same way.

    Args:
        rounds: `{name: seconds of each round}`; names are `"float32"`, the uniform
            labels, `"heuristic"`, `"searched"` or others (as complex as the searched plan).

    Returns:
        The names, first choice first.

    Example:

    ```python
    measured_ranking({"searched": [0.90, 1.00, 1.20], "float32": [0.89, 1.05, 1.10]})
    # ["float32", "searched"]: float32 wins the fastest round, the searched plan the median
    ```
    """
    medians = {name: float(np.median(figures)) for name, figures in rounds.items()}
    fastest = {name: float(min(figures)) for name, figures in rounds.items()}

    def simplicity(name: str) -> int:
        return _SIMPLICITY.get(name, 4 if name == "searched" else 3)

    def beats(first: str, second: str) -> bool:
        return medians[first] < medians[second] and fastest[first] < fastest[second]

    pool = list(rounds)
    order: list[str] = []
    while pool:
        unbeaten = [name for name in pool if not any(beats(other, name) for other in pool)]
        leader = min(unbeaten, key=lambda name: (simplicity(name), medians[name]))
        order.append(leader)
        pool.remove(leader)
    return order


def measured_seconds_of(
    context: SearchContext,
    chosen: optuna.trial.FrozenTrial | None,
    plan: PrecisionPlan,
    timed: dict[str, float],
    names: Mapping[int, str],
) -> float:
    """Returns the chosen plan's measured step seconds, timing it (and float32) if not yet timed."""
    name = "float32" if chosen is None else names.get(chosen.number)
    if name is not None and name in timed:
        return timed[name]
    float32_plan = context.plan_for(context.uniform_assignment(FLOAT32))
    float32_seconds, seconds = measure_step_seconds(context.evaluator, [float32_plan, plan])
    timed.setdefault("float32", float32_seconds)
    timed["chosen"] = seconds
    return seconds


def confirm_plan(
    context: SearchContext,
    ranked: list[optuna.trial.FrozenTrial],
    spread: float | None,
    train_data: Any,
    batch_size: int,
    confirm_steps: int | None,
) -> tuple[optuna.trial.FrozenTrial | None, dict]:
    """Confirms the chosen plan at a higher fidelity when needed; falls back down the ranking.

    Returns:
        `(the trial whose plan is returned, or None for float32; the confirmation record)`.
    """
    evaluator, budget = context.evaluator, context.budget
    if not ranked or is_float32(context, ranked[0]):
        return (ranked[0] if ranked else None), {"run": False, "reasons": ["float32 chosen"]}
    first = ranked[0]
    violation = float(first.user_attrs.get("budget_violation", 0.0))
    steps = len(evaluator.train_batches)
    reasons = confirmation_reasons(budget, context.reference, violation, spread, steps)
    if confirm_steps is None:
        confirm_steps = 4 * steps
    if not reasons or confirm_steps <= steps:
        return first, {"run": False, "reasons": reasons}
    searched_batches = evaluator.train_batches
    evaluator.set_train_batches(
        longer_batches(train_data, batch_size, confirm_steps, searched_batches)
    )
    record: dict = {"run": True, "reasons": reasons, "train_steps": confirm_steps}
    try:
        reference_metrics = evaluator.train_and_evaluate(
            context.plan_for(context.uniform_assignment(FLOAT32))
        )
        reference = reference_metrics[budget.log_name]
        record["reference_metric"] = finite_or_none(reference)
        record["threshold"] = finite_or_none(budget.threshold(reference))
        if not math.isfinite(reference):
            record["result"] = "skipped: float32 not finite at the confirmation's fidelity"
            return first, record
        attempts = []
        record["attempts"] = attempts
        for trial in ranked[:CONFIRMATION_ATTEMPTS]:
            if is_float32(context, trial):
                break
            metric = evaluator.train_and_evaluate(context.trial_plan(trial)).get(budget.log_name)
            held = budget.violation(reference, metric) <= 0
            attempts.append(
                {
                    "trial": trial.number,
                    "label": trial.user_attrs.get("warm_start")
                    or trial.user_attrs.get("neighbour"),
                    "metric": finite_or_none(metric),
                    "violation": finite_or_none(budget.violation(reference, metric)),
                    "held": held,
                }
            )
            say(
                context.verbose,
                "autoprec.search: confirmation at %d steps: trial %d %s %s = %s (float32 %.6g, "
                "limit %.6g)",
                confirm_steps,
                trial.number,
                "held" if held else "missed the budget:",
                budget.metric,
                "n/a" if metric is None else f"{metric:.6g}",
                reference,
                budget.threshold(reference),
            )
            if held:
                record["result"] = "held" if trial is first else "fell back"
                record["chosen_trial"] = trial.number
                return trial, record
        record["result"] = "fell back to float32"
        logger.warning(
            "autoprec.search: no plan held the budget when trained %d steps; returning float32.",
            confirm_steps,
        )
        return None, record
    finally:
        evaluator.set_train_batches(searched_batches)


def is_float32(context: SearchContext, trial: optuna.trial.FrozenTrial) -> bool:
    return all(dtype == FLOAT32 for dtype in context.trial_assignment(trial).values())


def finite_or_none(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


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
    return evaluator.step_rounds(list(plans), rounds=rounds, steps=5)
