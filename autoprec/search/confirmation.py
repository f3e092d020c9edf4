"""What the search does after its trials: time the finalists here, confirm the chosen one."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from .._core.dtypes import FLOAT32
from .._core.messages import show_message
from .._core.timing import RoundsVerdict, judge_rounds
from ..plan import PrecisionPlan
from .candidates import SEARCHED, finalist_plan, simplicity
from .context import SearchContext
from .fidelity import confirmation_reasons, longer_batches
from .record import TrialRecord
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
    """One plan the measured comparison times."""

    name: str
    plan: PrecisionPlan
    trial: optuna.trial.FrozenTrial | None


@dataclasses.dataclass(frozen=True)
class MeasuredRanking:
    """The ranking of the trials within budget after their plans' steps were timed here."""

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
    """Returns the plans to time: the best by predicted cost, float32, every finalist within budget."""
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
    """Reorders the ranking by measured rounds: the pure decision of `order_by_measurement`."""
    verdict = judge_rounds(rounds, simplicity)
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
    """Times every finalist within budget in the same interleaved rounds and ranks them."""
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
    """Returns the one line saying which plan the measured step chose, and by how much."""
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
    """The chosen plan's measured step beside float32's."""

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
    """Returns the chosen plan's measured step, timing it (and float32) if the ranking did not."""
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
    """What the confirmation decided: the trial whose plan is returned, and its record."""

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
    """Confirms the chosen plan at a higher fidelity when needed; falls back down the ranking."""
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
