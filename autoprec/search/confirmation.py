"""What the search does after its trials: time the finalists here, confirm the chosen one.

The measured step has the last word over predicted costs (`order_by_measurement`):
every finalist within budget (the best plan by predicted cost, float32, the uniform
plans, the heuristic's, Keras' own global policies and the plans with a protection
dropped) is timed in the same interleaved rounds, more rounds while the leader is
within the noise of another plan, and a tie goes to the simpler plan (`rounds.py`). A
plan chosen at a low fidelity or by a close margin is trained again for longer,
against float32 trained as long, before it is returned (`confirm_plan`), falling back
down the measured ranking.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from .._core.dtypes import FLOAT32
from .._core.messages import show_message
from ..plan import PrecisionPlan
from .candidates import SEARCHED, finalist_plan
from .context import SearchContext
from .fidelity import confirmation_reasons, longer_batches
from .record import TrialRecord
from .rounds import RoundsVerdict, judge_rounds
from .timing import measure_step_seconds, measure_until_decided

logger = logging.getLogger("autoprec")

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
        name: `"float32"`, a finalist's label (`"uniform bfloat16"`, `"keras
            mixed_bfloat16"`, `"heuristic"`, `"no float32 softmax"`...) or `"searched"`.
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
        trials: the trials, first choice first: the timed ones in the verdict's order,
            then the others by predicted cost; it stops where float32 ranks when
            float32 is not among the trials (empty when float32 measured first).
        order: the timed plans' names, first choice first.
        rounds: `{name: seconds per step of each round}`.
        names: `{trial number: name}` of the timed trials.
        replaced_by: the name of the plan that replaced the best plan by predicted
            cost at the head of the ranking, or `None`.
        replacing_trial: that plan's trial number, or `None`.
        verdict: the `RoundsVerdict` (leader, tie or separation, noise).

    Example:

    ```python
    ranking = order_by_measurement(context, ranked)
    ranking.trials[0], ranking.fastest["float32"], ranking.verdict.verdict
    ```
    """

    trials: tuple[optuna.trial.FrozenTrial, ...]
    order: tuple[str, ...]
    rounds: Mapping[str, tuple[float, ...]]
    names: Mapping[int, str]
    replaced_by: str | None = None
    replacing_trial: int | None = None
    verdict: RoundsVerdict | None = None

    @property
    def fastest(self) -> dict[str, float]:
        """`{name: seconds of its fastest round}`."""
        return {name: min(figures) for name, figures in self.rounds.items()}

    def to_dict(self) -> dict[str, Any]:
        """Returns what `plan.metadata["search"]["measurement"]` keeps: rounds, noise, verdict."""
        record: dict[str, Any] = {
            "rounds": {name: list(figures) for name, figures in self.rounds.items()},
            "trials": {name: number for number, name in self.names.items()},
        }
        if self.verdict is not None:
            record.update(self.verdict.to_dict())
        return record


def finalist_name(context: SearchContext, trial: optuna.trial.FrozenTrial) -> str:
    """Returns the name a trial is timed under: `"float32"`, its warm start's label or `"searched"`."""
    if context.is_float32(trial):
        return FLOAT32
    return TrialRecord.from_trial(trial).warm_start or SEARCHED


def measurement_candidates(
    context: SearchContext, ranked: Sequence[optuna.trial.FrozenTrial]
) -> list[TimedPlan]:
    """Returns the plans to time: the best by predicted cost, float32, every finalist within budget.

    Args:
        context: the search's context.
        ranked: the trials within budget, cheapest first (the first is the best by
            predicted cost, timed as `"searched"` unless it is a warm start).

    Returns:
        The `TimedPlan`s, the best by predicted cost first, float32 second (first when
        it is the best), then each warm start's label once (uniform plans, the
        heuristic's, Keras' global policies, plans with a protection dropped).
    """
    best = ranked[0]
    float32_trial = next((trial for trial in ranked if context.is_float32(trial)), None)
    candidates = [TimedPlan(finalist_name(context, best), finalist_plan(context, best), best)]
    if candidates[0].name != FLOAT32:
        candidates.append(TimedPlan(FLOAT32, context.float32_plan(), float32_trial))
    for trial in ranked[1:]:
        label = TrialRecord.from_trial(trial).warm_start or ""
        if label and not context.is_float32(trial) and all(label != c.name for c in candidates):
            candidates.append(TimedPlan(label, finalist_plan(context, trial), trial))
    return candidates


def rank_by_measurement(
    ranked: Sequence[optuna.trial.FrozenTrial],
    timed: Mapping[str, optuna.trial.FrozenTrial | None],
    rounds: Mapping[str, Sequence[float]],
) -> MeasuredRanking:
    """Reorders the ranking by measured rounds: the pure decision of `order_by_measurement`.

    The timed plans are ordered by `judge_rounds` (the fastest beyond the noise, or the
    simplest of a tie); the trials not timed follow by predicted cost. Where float32
    is not among the trials (a study resumed at another fidelity), the ranking stops
    at float32: nothing ranked below it is chosen over it.

    Args:
        ranked: the trials within budget, cheapest first.
        timed: `{name: trial or None}` of the timed plans (`"float32"`, warm start
            labels, `"searched"`).
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
    verdict = judge_rounds(rounds)
    order = verdict.order
    names = {
        trial.number: name for name, trial in timed.items() if trial is not None and name in rounds
    }
    figures = {name: tuple(float(value) for value in rounds[name]) for name in rounds}
    reordered: list[optuna.trial.FrozenTrial] = []
    stopped = False
    for name in order:
        trial = timed[name]
        if trial is None:  # float32, not among the trials: nothing below it is chosen
            stopped = True
            break
        if all(trial.number != other.number for other in reordered):
            reordered.append(trial)
    if not stopped:
        reordered += [trial for trial in ranked if trial.number not in names]
    replaced = bool(reordered) and reordered[0].number != ranked[0].number
    return MeasuredRanking(
        tuple(reordered),
        tuple(order),
        figures,
        names,
        replaced_by=order[0] if replaced else None,
        replacing_trial=reordered[0].number if replaced else None,
        verdict=verdict,
    )


def order_by_measurement(
    context: SearchContext, ranked: Sequence[optuna.trial.FrozenTrial]
) -> MeasuredRanking:
    """Times every finalist within budget in the same interleaved rounds and ranks them.

    Per-layer costs can rank a mixed plan ahead of a uniform one that the whole
    step runs faster; the measured step has the last word. The finalists
    (`measurement_candidates`) are timed at least `MIN_ROUNDS` rounds, and the plans
    still within the noise of the fastest again, up to `MAX_ROUNDS` rounds and
    `MEASUREMENT_SECONDS` (`measure_until_decided`); the fastest leads when it is
    ahead of every other plan beyond the noise, else the simplest of the tie does
    (`rank_by_measurement`). The confirmation falls back down this ranking.

    Args:
        context: the search's context (its evaluator times the plans).
        ranked: the trials within budget, cheapest first.

    Returns:
        The `MeasuredRanking`.

    Example:

    ```python
    ranking = order_by_measurement(context, ranked_finalists(context, study))
    chosen = ranking.trials[0] if ranking.trials else None  # None: float32
    ```
    """
    candidates = measurement_candidates(context, ranked)
    rounds = measure_until_decided(
        context.evaluator, {candidate.name: candidate.plan for candidate in candidates}
    )
    ranking = rank_by_measurement(
        ranked, {candidate.name: candidate.trial for candidate in candidates}, rounds
    )
    say(context.verbose, "%s", verdict_line(ranking))
    return ranking


def verdict_line(ranking: MeasuredRanking) -> str:
    """Returns the one line saying which plan the measured step chose, and by how much.

    Args:
        ranking: a `MeasuredRanking` with its verdict.

    Returns:
        `"autoprec.search: measured step (N interleaved rounds): ..."`: the leader, its
        median against float32's, and whether it is ahead beyond the noise or won a tie.
    """
    verdict = ranking.verdict
    if verdict is None:
        return "autoprec.search: measured step: no verdict."
    medians = verdict.medians
    leader = verdict.leader
    rounds = max(verdict.rounds.values())
    head = f"autoprec.search: measured step ({rounds} interleaved rounds, {len(medians)} plans): "
    against = ""
    if leader != FLOAT32 and FLOAT32 in medians:
        against = (
            f" against float32's {1e3 * medians[FLOAT32]:.4g} ms "
            f"({medians[FLOAT32] / medians[leader]:.3g}x)"
        )
    if verdict.decided:
        others = sorted(verdict.comparisons.items(), key=lambda item: item[1].margin)
        nearest = (
            f"; next {others[0][0]}, slower by {1e3 * others[0][1].margin:.3g} ms "
            f"(noise {1e3 * others[0][1].noise:.2g} ms)"
            if others
            else ""
        )
        return f"{head}{leader} leads, {1e3 * medians[leader]:.4g} ms median{against}{nearest}."
    tied = ", ".join(f"{name} {1e3 * medians[name]:.4g} ms" for name in verdict.contenders)
    return (
        f"{head}a tie within the noise ({tied}); using the simpler {leader}, "
        f"{1e3 * medians[leader]:.4g} ms median{against}."
    )


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
    name = FLOAT32 if chosen is None else names.get(chosen.number)
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
    plan = finalist_plan(context, trial)
    metric = context.evaluator.train_and_evaluate(plan).get(budget.log_name)
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
