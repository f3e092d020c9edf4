"""The finalists' labels, their measured ranking, and the confirmation of the chosen plan at a higher fidelity."""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from .._core.dtypes import BFLOAT16, FLOAT16, FLOAT32
from .._core.models import show_message
from .._core.timing import RoundsVerdict, judge_rounds
from ..layers import LayerInfo, model_fingerprint
from ..plan import PrecisionPlan
from ..profiler import Profile
from .context import SearchContext
from .evaluator import confirmation_reasons, longer_batches
from .record import (
    SEARCHED,
    TrialRecord,
    assignment_key,
    dropped_label,
    keras_dtype,
    plan_default,
    simplicity,
)
from .space import SENSITIVE_CLASS_PATTERNS, matches_any
from .study import is_feasible
from .timing import measure_step_seconds, measure_until_decided


def keras_global_plan(
    context: SearchContext, dtype: str, keep_float32: Sequence[str] = ()
) -> PrecisionPlan:
    """Returns Keras' global policy as Keras applies it: every layer in `dtype`, containers too."""
    plan = PrecisionPlan.uniform(context.model, dtype)
    if not keep_float32:
        return plan
    layers = dict(plan.layers)
    for path in layers:
        info = context.infos.get(path)
        if info is not None and matches_any(path, info, keep_float32):
            layers[path] = FLOAT32
    return exact_plan(context, layers, plan_default(dtype))


def exact_plan(context: SearchContext, layers: Mapping[str, str], default: str) -> PrecisionPlan:
    """Returns the plan naming `layers` (containers included) with `default` elsewhere."""
    return PrecisionPlan(
        dict(layers),
        default=default,
        layer_info=context.infos,
        fingerprint=model_fingerprint(dict(context.infos)),
        model_name=context.model.name,
    )


def finalist_plan(context: SearchContext, trial: optuna.trial.FrozenTrial) -> PrecisionPlan:
    """Returns the plan a trial evaluated: a Keras global policy exactly, else its assignment's."""
    record = TrialRecord.from_trial(trial)
    dtype = keras_dtype(record.warm_start)
    if dtype is None or not record.assignment:
        return context.trial_plan(trial)
    return exact_plan(context, record.assignment, plan_default(dtype))


def finalist_key(context: SearchContext, trial: optuna.trial.FrozenTrial) -> str:
    """Returns a key equal for trials that evaluated the same plan (containers counted)."""
    record = TrialRecord.from_trial(trial)
    if keras_dtype(record.warm_start) is not None and record.assignment_key:
        return record.assignment_key
    return assignment_key(context.trial_assignment(trial))


def ranked_finalists(context: SearchContext, study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Returns the completed trials within budget, cheapest first, one per plan."""
    feasible = [
        trial
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if is_feasible(trial) and trial.value is not None
    ]
    ranked, seen = [], set()
    for trial in sorted(feasible, key=lambda t: (t.value, t.number)):
        key = finalist_key(context, trial)
        if key not in seen:
            seen.add(key)
            ranked.append(trial)
    return ranked


def protections(
    compute: Sequence[str], infos: Mapping[str, LayerInfo], outputs: Sequence[str]
) -> dict[str, tuple[str, ...]]:
    """Returns `{kind: compute paths}` of the default float32 protections, one entry per kind."""
    softmax = tuple(pattern for pattern in SENSITIVE_CLASS_PATTERNS if "Softmax" in pattern)
    normalisation = tuple(pattern for pattern in SENSITIVE_CLASS_PATTERNS if pattern not in softmax)

    def of_class(patterns: Sequence[str]) -> tuple[str, ...]:
        return tuple(
            path
            for path in compute
            if any(fnmatch.fnmatchcase(infos[path].class_name, pattern) for pattern in patterns)
        )

    return {
        "softmax": of_class(softmax),
        "normalisation": of_class(normalisation),
        "outputs": tuple(path for path in compute if path in set(outputs)),
    }


def sixteen_bit_dtype(assignment: Mapping[str, str]) -> str | None:
    """Returns the 16-bit dtype most layers of `assignment` take (bfloat16 among equals), or `None`."""
    counts = {
        dtype: sum(value == dtype for value in assignment.values()) for dtype in (BFLOAT16, FLOAT16)
    }
    best = max(counts, key=lambda dtype: (counts[dtype], dtype == BFLOAT16))
    return best if counts[best] else None


def fits_profile(profile: Profile | None, path: str, dtype: str) -> bool:
    """Whether the profile shows a layer's forward values and gradients fit `dtype`."""
    if profile is None:
        return False
    layer, parts = None, path.split("/")
    while parts and layer is None:
        layer = profile.layers.get("/".join(parts))
        parts = parts[:-1]
    if layer is None:
        return False
    return layer.float16_safe if dtype == FLOAT16 else layer.bfloat16_safe


def dropped_protection(
    assignment: Mapping[str, str],
    kinds: Mapping[str, Sequence[str]],
    allowed: Mapping[str, Sequence[str]],
    profile: Profile | None,
) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Returns the plans with one protection kind moved to the plan's 16-bit dtype, and why not."""
    dtype = sixteen_bit_dtype(assignment)
    plans: dict[str, dict[str, str]] = {}
    skipped: dict[str, str] = {}
    for kind, paths in kinds.items():
        label = dropped_label(kind)
        kept = [path for path in paths if assignment.get(path) == FLOAT32]
        if dtype is None:
            skipped[label] = "the plan has no 16-bit layer"
        elif profile is None:
            skipped[label] = "no profile to show the ranges fit"
        elif not kept:
            skipped[label] = f"no {kind} layer kept in float32"
        else:
            moved = [
                path
                for path in kept
                if dtype in allowed.get(path, ()) and fits_profile(profile, path, dtype)
            ]
            if moved:
                plans[label] = {**assignment, **dict.fromkeys(moved, dtype)}
            else:
                skipped[label] = f"the profile does not show the {kind} ranges fit {dtype}"
    return plans, skipped


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
