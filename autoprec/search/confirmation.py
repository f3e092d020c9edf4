"""What the search does after its trials: time the best plans here, confirm the chosen one.

The measured step has the last word over predicted costs (`order_by_measurement`), and a
plan chosen at a low fidelity or by a close margin is trained again for longer, against
float32 trained as long, before it is returned (`confirm_plan`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import optuna

from .._core.messages import show_message
from ..plan import PrecisionPlan
from .context import SearchContext
from .evaluator import Evaluator
from .fidelity import confirmation_reasons, longer_batches
from .record import TrialRecord

logger = logging.getLogger("autoprec")

#: Interleaved timing rounds of that comparison.
MEASURED_ROUNDS = 5
#: Plans confirmed at the higher fidelity, down the ranking, before falling back to float32.
CONFIRMATION_ATTEMPTS = 3


def say(verbose: int, text: str, *arguments: object) -> None:
    """Shows one progress line (`text % arguments`) when `verbose` asks for it."""
    if verbose:
        show_message(text % arguments)


@dataclasses.dataclass(frozen=True)
class TimedPlan:
    """One plan the measured comparison times.

    Attributes:
        name: `"searched"`, `"float32"` or a warm start's label.
        plan: the plan.
        trial: the trial that evaluated it, or `None` (float32 not among the trials).
    """

    name: str
    plan: PrecisionPlan
    trial: optuna.trial.FrozenTrial | None


@dataclasses.dataclass(frozen=True)
class MeasuredRanking:
    """The ranking of the trials within budget after their plans' steps were timed here.

    Attributes:
        trials: the trials, first choice first: the timed ones in `measured_ranking`'s
            order, then the others by predicted cost; empty when float32 (not among the
            trials) measured first.
        order: the timed plans' names, first choice first.
        rounds: `{name: seconds per step of each round}`.
        names: `{trial number: name}` of the timed trials.
        replaced_by: the name of the plan that replaced the searched plan at the head
            of the ranking, or `None`.
        replacing_trial: that plan's trial number, or `None`.

    Example:

    ```python
    ranking = order_by_measurement(context, ranked)
    ranking.trials[0], ranking.fastest["float32"]
    ```
    """

    trials: tuple[optuna.trial.FrozenTrial, ...]
    order: tuple[str, ...]
    rounds: Mapping[str, tuple[float, ...]]
    names: Mapping[int, str]
    replaced_by: str | None = None
    replacing_trial: int | None = None

    @property
    def fastest(self) -> dict[str, float]:
        """`{name: seconds of its fastest round}`."""
        return {name: min(figures) for name, figures in self.rounds.items()}


def measurement_candidates(
    context: SearchContext, ranked: Sequence[optuna.trial.FrozenTrial]
) -> list[TimedPlan]:
    """Returns the plans to time: the searched plan, float32, each warm start within budget.

    Args:
        context: the search's context.
        ranked: the trials within budget, cheapest first (the first is the searched plan).

    Returns:
        The `TimedPlan`s, the searched plan first, float32 second.
    """
    best = ranked[0]
    float32_trial = next((trial for trial in ranked if context.is_float32(trial)), None)
    candidates = [
        TimedPlan("searched", context.trial_plan(best), best),
        TimedPlan("float32", context.float32_plan(), float32_trial),
    ]
    for trial in ranked[1:]:
        label = TrialRecord.from_trial(trial).warm_start or ""
        if label and all(label != candidate.name for candidate in candidates):
            candidates.append(TimedPlan(label, context.trial_plan(trial), trial))
    return candidates


def rank_by_measurement(
    ranked: Sequence[optuna.trial.FrozenTrial],
    timed: Mapping[str, optuna.trial.FrozenTrial | None],
    rounds: Mapping[str, Sequence[float]],
) -> MeasuredRanking:
    """Reorders the ranking by measured rounds: the pure decision of `order_by_measurement`.

    Args:
        ranked: the trials within budget, cheapest first (the first is `"searched"`).
        timed: `{name: trial or None}` of the timed plans (`"searched"`, `"float32"`,
            warm start labels).
        rounds: `{name: seconds of each round}` of the same plans.

    Returns:
        The `MeasuredRanking`.

    Example:

    ```python
    ranking = rank_by_measurement(ranked, {"searched": ranked[0], "float32": None},
                                  {"searched": [0.9, 1.0], "float32": [0.5, 0.6]})
    ranking.trials  # (): float32, not among the trials, measured faster
    ```
    """
    order = measured_ranking(rounds)
    names = {trial.number: name for name, trial in timed.items() if trial is not None}
    figures = {name: tuple(float(value) for value in rounds[name]) for name in rounds}
    reordered: list[optuna.trial.FrozenTrial] = []
    for name in order:
        trial = timed[name]
        if trial is None:  # float32, not among the trials (a study resumed at another fidelity)
            break
        if all(trial.number != other.number for other in reordered):
            reordered.append(trial)
    if order[0] == "float32" and timed["float32"] is None:
        return MeasuredRanking((), tuple(order), figures, names)
    reordered += [trial for trial in ranked if trial.number not in names]
    replaced = order[0] != "searched" and reordered and reordered[0].number != ranked[0].number
    return MeasuredRanking(
        tuple(reordered),
        tuple(order),
        figures,
        names,
        replaced_by=order[0] if replaced else None,
        replacing_trial=reordered[0].number if replaced else None,
    )


def order_by_measurement(
    context: SearchContext, ranked: Sequence[optuna.trial.FrozenTrial]
) -> MeasuredRanking:
    """Times the searched plan beside float32 and every warm start within budget, interleaved.

    Per-layer costs can rank a mixed plan ahead of a uniform one that the whole
    step runs faster; the measured step has the last word. The timed plans are
    ranked by `measured_ranking`: first the simplest plan (float32, then the uniform
    16-bit plans, then the heuristic's, then the searched one) that no other plan
    beats in both its median and its fastest round, so a split decision, which is
    noise, goes to the simpler plan, never to a mixed plan that may be slower. The
    confirmation falls back down this ranking; plans not timed follow, by predicted
    cost (`rank_by_measurement`).

    Args:
        context: the search's context (its evaluator times the plans).
        ranked: the trials within budget, cheapest first.

    Returns:
        The `MeasuredRanking`.

    Example:

    ```python
    ranking = order_by_measurement(context, ranked_feasible(context, study))
    chosen = ranking.trials[0] if ranking.trials else None  # None: float32
    ```
    """
    candidates = measurement_candidates(context, ranked)
    figures = measure_step_rounds(
        context.evaluator, [candidate.plan for candidate in candidates], rounds=MEASURED_ROUNDS
    )
    rounds = {candidate.name: list(f) for candidate, f in zip(candidates, figures)}
    ranking = rank_by_measurement(
        ranked, {candidate.name: candidate.trial for candidate in candidates}, rounds
    )
    first = ranking.order[0]
    if first != "searched":
        fastest = ranking.fastest
        say(
            context.verbose,
            "autoprec.search: the searched plan did not measure faster than %s (median %.4g ms "
            "against %.4g ms, fastest %.4g ms against %.4g ms); using %s.",
            first,
            1e3 * float(np.median(rounds["searched"])),
            1e3 * float(np.median(rounds[first])),
            1e3 * fastest["searched"],
            1e3 * fastest[first],
            first,
        )
    return ranking


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


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """The chosen plan's measured step beside float32's.

    Attributes:
        float32_seconds: float32's seconds per step.
        plan_seconds: the chosen plan's seconds per step.
        fastest: `{name: fastest round's seconds}` of every plan timed (`"chosen"` when
            the chosen plan was timed on its own).
        rounds: `{name: seconds of each round}` of the measured ranking's plans.
    """

    float32_seconds: float
    plan_seconds: float
    fastest: Mapping[str, float]
    rounds: Mapping[str, tuple[float, ...]]

    @property
    def speedup(self) -> float:
        """float32's step time over the chosen plan's."""
        return self.float32_seconds / self.plan_seconds


def chosen_step_timing(
    context: SearchContext,
    chosen: optuna.trial.FrozenTrial | None,
    plan: PrecisionPlan,
    ranking: MeasuredRanking | None,
) -> StepTiming:
    """Returns the chosen plan's measured step, timing it (and float32) if the ranking did not.

    Args:
        context: the search's context.
        chosen: the chosen trial, or `None` for float32.
        plan: the chosen plan.
        ranking: the measured ranking, or `None` when none was measured.

    Returns:
        The `StepTiming`.
    """
    fastest = dict(ranking.fastest) if ranking is not None else {}
    rounds = dict(ranking.rounds) if ranking is not None else {}
    names = ranking.names if ranking is not None else {}
    name = "float32" if chosen is None else names.get(chosen.number)
    if name is not None and name in fastest:
        return StepTiming(fastest["float32"], fastest[name], fastest, rounds)
    float32_seconds, seconds = measure_step_seconds(
        context.evaluator, [context.float32_plan(), plan]
    )
    fastest.setdefault("float32", float32_seconds)
    fastest["chosen"] = seconds
    return StepTiming(fastest["float32"], seconds, fastest, rounds)


@dataclasses.dataclass(frozen=True)
class Confirmation:
    """What the confirmation decided: the trial whose plan is returned, and its record.

    Attributes:
        chosen: the trial whose plan is returned, or `None` for float32.
        record: the JSON record kept in `plan.metadata["search"]["confirmation"]`:
            `run`, `reasons`, and when it ran `train_steps`, `reference_metric`,
            `threshold`, `attempts`, `result` and `chosen_trial`.
    """

    chosen: optuna.trial.FrozenTrial | None
    record: Mapping[str, Any]


def confirm_plan(
    context: SearchContext,
    ranked: Sequence[optuna.trial.FrozenTrial],
    spread: float | None,
    train_data: Any,
    batch_size: int,
    confirm_steps: int | None,
) -> Confirmation:
    """Confirms the chosen plan at a higher fidelity when needed; falls back down the ranking.

    The first trial is confirmed when the search's fidelity was low or its margin close
    (`confirmation_reasons`): it and float32 are trained `confirm_steps` steps (default
    4 x the search's) from the same weights; a plan that misses the budget there gives
    way to the next (`CONFIRMATION_ATTEMPTS` at most, then float32).

    Args:
        context: the search's context.
        ranked: the trials within budget, first choice first.
        spread: the float32 reference's seed-to-seed spread, or `None`.
        train_data: the training data, to take the longer training's batches from.
        batch_size: the batch size of array data.
        confirm_steps: training steps of the confirmation; `0` never confirms.

    Returns:
        The `Confirmation`.

    Example:

    ```python
    confirmation = confirm_plan(context, ranking.trials, None, (x, y), 32, None)
    confirmation.chosen, confirmation.record["result"]
    ```
    """
    evaluator = context.evaluator
    if not ranked or context.is_float32(ranked[0]):
        chosen = ranked[0] if ranked else None
        return Confirmation(chosen, {"run": False, "reasons": ["float32 chosen"]})
    first = ranked[0]
    violation = TrialRecord.from_trial(first).budget_violation or 0.0
    steps = len(evaluator.train_batches)
    reasons = confirmation_reasons(context.budget, context.reference, violation, spread, steps)
    if confirm_steps is None:
        confirm_steps = 4 * steps
    if not reasons or confirm_steps <= steps:
        return Confirmation(first, {"run": False, "reasons": reasons})
    searched_batches = evaluator.train_batches
    evaluator.set_train_batches(
        longer_batches(train_data, batch_size, confirm_steps, searched_batches)
    )
    try:
        return _confirm_longer(context, ranked, reasons, confirm_steps)
    finally:
        evaluator.set_train_batches(searched_batches)


def _confirm_longer(
    context: SearchContext,
    ranked: Sequence[optuna.trial.FrozenTrial],
    reasons: list[str],
    confirm_steps: int,
) -> Confirmation:
    """Trains float32 and then the ranked plans at the confirmation's fidelity."""
    budget = context.budget
    record: dict[str, Any] = {"run": True, "reasons": reasons, "train_steps": confirm_steps}
    reference = context.evaluator.train_and_evaluate(context.float32_plan())[budget.log_name]
    record["reference_metric"] = finite_or_none(reference)
    record["threshold"] = finite_or_none(budget.threshold(reference))
    if not math.isfinite(reference):
        record["result"] = "skipped: float32 not finite at the confirmation's fidelity"
        return Confirmation(ranked[0], record)
    attempts: list[dict[str, Any]] = []
    record["attempts"] = attempts
    for trial in ranked[:CONFIRMATION_ATTEMPTS]:
        if context.is_float32(trial):
            break
        attempt = _attempt(context, trial, reference, confirm_steps)
        attempts.append(attempt)
        if attempt["held"]:
            record["result"] = "held" if trial is ranked[0] else "fell back"
            record["chosen_trial"] = trial.number
            return Confirmation(trial, record)
    record["result"] = "fell back to float32"
    logger.warning(
        "autoprec.search: no plan held the budget when trained %d steps; returning float32.",
        confirm_steps,
    )
    return Confirmation(None, record)


def _attempt(
    context: SearchContext, trial: optuna.trial.FrozenTrial, reference: float, confirm_steps: int
) -> dict[str, Any]:
    """Trains one trial's plan at the confirmation's fidelity; returns its attempt record."""
    budget = context.budget
    metric = context.evaluator.train_and_evaluate(context.trial_plan(trial)).get(budget.log_name)
    violation = budget.violation(reference, metric)
    held = violation <= 0
    say(
        context.verbose,
        "autoprec.search: confirmation at %d steps: trial %d %s %s = %s (float32 %.6g, limit %.6g)",
        confirm_steps,
        trial.number,
        "held" if held else "missed the budget:",
        budget.metric,
        "n/a" if metric is None else f"{metric:.6g}",
        reference,
        budget.threshold(reference),
    )
    return {
        "trial": trial.number,
        "label": TrialRecord.from_trial(trial).label,
        "metric": finite_or_none(metric),
        "violation": finite_or_none(violation),
        "held": held,
    }


def finite_or_none(value: float | None) -> float | None:
    """Returns `value` as a float, or `None` when missing or not finite."""
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
