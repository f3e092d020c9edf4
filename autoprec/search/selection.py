"""After the trials: finalists, the measured ranking, the confirmation at a higher fidelity and the result."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32, PLAN_DTYPES
from .._core.timing import RoundsVerdict, judge_rounds
from ..hardware import is_local
from ..layers import LayerInfo
from ..plan import PrecisionPlan
from ..profiler import Profile
from .budget import OutputFloor, json_safe
from .context import SearchContext, say
from .evaluator import (
    confirmation_reasons,
    longer_batches,
    measure_step_seconds,
    measure_until_decided,
)
from .result import (
    SEARCHED,
    SearchResult,
    TrialRecord,
    assignment_key,
    dropped_label,
    keras_dtype,
    keras_label,
    measurement_text,
    plan_default,
    simplicity,
)
from .space import (
    SENSITIVE_CLASS_PATTERNS,
    is_sensitive,
    matches_any,
    plan_from_assignment,
    with_loss_scale_start,
)
from .study import (
    COST_STEP,
    WarmStart,
    enqueue_candidates,
    feasible_trials,
    judged_record,
    optimize,
    pareto_points,
    prediction,
    trial_counts,
    trial_plan_metadata,
    warm_start_summary,
)

logger = logging.getLogger("autoprec")


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
    return plan_from_assignment(context.model, context.infos, layers, plan_default(dtype))


def finalist_plan(context: SearchContext, trial: optuna.trial.FrozenTrial) -> PrecisionPlan:
    """Returns the plan a trial evaluated: a Keras global policy exactly, else its assignment's."""
    record = TrialRecord.from_trial(trial)
    dtype = keras_dtype(record.warm_start)
    if dtype is None or not record.assignment:
        return context.trial_plan(trial)
    return plan_from_assignment(
        context.model, context.infos, record.assignment, plan_default(dtype)
    )


def finalist_key(context: SearchContext, trial: optuna.trial.FrozenTrial) -> str:
    """Returns a key equal for trials that evaluated the same plan (containers counted)."""
    record = TrialRecord.from_trial(trial)
    if keras_dtype(record.warm_start) is not None and record.assignment_key:
        return record.assignment_key
    return assignment_key(context.trial_assignment(trial))


def ranked_finalists(context: SearchContext, study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Returns the completed trials within budget, cheapest first, one per plan."""
    unique: dict[str, optuna.trial.FrozenTrial] = {}
    for trial in feasible_trials(study):
        unique.setdefault(finalist_key(context, trial), trial)
    return list(unique.values())


def protections(
    compute: Sequence[str], infos: Mapping[str, LayerInfo], outputs: Sequence[str]
) -> dict[str, tuple[str, ...]]:
    """Returns `{kind: compute paths}` of the default float32 protections, one entry per kind."""
    softmax = tuple(pattern for pattern in SENSITIVE_CLASS_PATTERNS if "Softmax" in pattern)
    normalisation = tuple(pattern for pattern in SENSITIVE_CLASS_PATTERNS if pattern not in softmax)
    return {
        "softmax": tuple(path for path in compute if is_sensitive(infos[path], softmax)),
        "normalisation": tuple(
            path for path in compute if is_sensitive(infos[path], normalisation)
        ),
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


#: Plans confirmed at the higher fidelity, down the ranking, before falling back to float32.
CONFIRMATION_ATTEMPTS = 3


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


def measurement_candidates(
    context: SearchContext, ranked: Sequence[optuna.trial.FrozenTrial]
) -> dict[str, tuple[PrecisionPlan, optuna.trial.FrozenTrial | None]]:
    """Returns `{name: (plan, trial)}` to time: the best predicted, float32, each finalist."""
    best = ranked[0]
    float32_trial = next((trial for trial in ranked if context.is_float32(trial)), None)
    # The best is timed as "float32", under its warm start's label, or as "searched".
    name = FLOAT32 if context.is_float32(best) else TrialRecord.from_trial(best).warm_start
    candidates = {name or SEARCHED: (finalist_plan(context, best), best)}
    candidates.setdefault(FLOAT32, (context.float32_plan(), float32_trial))
    for trial in ranked[1:]:
        label = TrialRecord.from_trial(trial).warm_start or ""
        if label and not context.is_float32(trial) and label not in candidates:
            candidates[label] = (finalist_plan(context, trial), trial)
    return candidates


def rank_by_measurement(
    ranked: Sequence[optuna.trial.FrozenTrial],
    timed: Mapping[str, optuna.trial.FrozenTrial | None],
    rounds: Mapping[str, Sequence[float]],
) -> MeasuredRanking:
    """Reorders the ranking by measured rounds: the pure decision of `order_by_measurement`."""
    verdict = judge_rounds(rounds, simplicity)
    names = {
        trial.number: name for name, trial in timed.items() if trial is not None and name in rounds
    }
    figures = {name: tuple(float(value) for value in rounds[name]) for name in rounds}
    reordered: list[optuna.trial.FrozenTrial] = []
    for name in verdict.order:
        trial = timed[name]
        if trial is None:  # float32, not among the trials: nothing below it is chosen
            break
        if all(trial.number != other.number for other in reordered):
            reordered.append(trial)
    else:
        reordered += [trial for trial in ranked if trial.number not in names]
    replaced = bool(reordered) and reordered[0].number != ranked[0].number
    return MeasuredRanking(
        tuple(reordered),
        tuple(verdict.order),
        figures,
        names,
        replaced_by=verdict.order[0] if replaced else None,
        replacing_trial=reordered[0].number if replaced else None,
        verdict=verdict,
    )


def order_by_measurement(
    context: SearchContext, ranked: Sequence[optuna.trial.FrozenTrial]
) -> MeasuredRanking:
    """Times every finalist within budget in the same interleaved rounds and ranks them."""
    candidates = measurement_candidates(context, ranked)
    rounds = measure_until_decided(
        context.evaluator, {name: plan for name, (plan, _) in candidates.items()}
    )
    ranking = rank_by_measurement(
        ranked, {name: trial for name, (_, trial) in candidates.items()}, rounds
    )
    say(context.verbose, measurement_text(ranking.to_dict()))
    return ranking


def chosen_step_timing(
    context: SearchContext,
    chosen: optuna.trial.FrozenTrial | None,
    plan: PrecisionPlan,
    ranking: MeasuredRanking | None,
) -> dict[str, Any]:
    """Returns the metadata's `measured_*` steps of the chosen plan and float32, timed if not yet."""
    fastest = dict(ranking.fastest) if ranking is not None else {}
    rounds = {name: list(f) for name, f in (ranking.rounds if ranking else {}).items()}
    name = FLOAT32 if chosen is None else (ranking.names if ranking else {}).get(chosen.number)
    if name is None or name not in fastest:
        float32_seconds, fastest["chosen"] = measure_step_seconds(
            context.evaluator, [context.float32_plan(), plan]
        )
        fastest.setdefault(FLOAT32, float32_seconds)
        name = "chosen"
    return {
        "measured_float32_step_seconds": fastest[FLOAT32],
        "measured_plan_step_seconds": fastest[name],
        "measured_step_seconds": fastest,
        "measured_step_rounds": rounds,
    }


def confirm_plan(
    context: SearchContext,
    ranked: Sequence[optuna.trial.FrozenTrial],
    confirm_steps: int | None = None,
) -> tuple[optuna.trial.FrozenTrial | None, dict[str, Any]]:
    """Returns `(chosen trial, record)`: the first plan, confirmed longer where needed, or the next."""
    evaluator = context.evaluator
    if not ranked or context.is_float32(ranked[0]):
        return (ranked[0] if ranked else None), {"run": False, "reasons": ["float32 chosen"]}
    violation = TrialRecord.from_trial(ranked[0]).budget_violation or 0.0
    steps = len(evaluator.train_batches)
    reasons = confirmation_reasons(
        context.budget, context.reference, violation, context.spread, steps
    )
    confirm_steps = 4 * steps if confirm_steps is None else confirm_steps
    if not reasons or confirm_steps <= steps:
        return ranked[0], {"run": False, "reasons": reasons}
    searched_batches = evaluator.train_batches
    evaluator.set_train_batches(
        longer_batches(
            context.train_data, context.settings.batch_size, confirm_steps, searched_batches
        )
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
) -> tuple[optuna.trial.FrozenTrial | None, dict[str, Any]]:
    """Trains float32 and then the ranked plans at the confirmation's fidelity."""
    budget = context.budget
    record: dict[str, Any] = {"run": True, "reasons": reasons, "train_steps": confirm_steps}
    reference = context.evaluator.train_and_evaluate(context.float32_plan())[budget.log_name]
    record["reference_metric"] = json_safe(reference)
    record["threshold"] = json_safe(budget.threshold(reference))
    if not math.isfinite(reference):
        record["result"] = "skipped: float32 not finite at the confirmation's fidelity"
        return ranked[0], record
    record["attempts"] = attempts = []
    for trial in ranked[:CONFIRMATION_ATTEMPTS]:
        if context.is_float32(trial):
            break
        plan = finalist_plan(context, trial)
        metric = context.evaluator.train_and_evaluate(plan).get(budget.log_name)
        violation = budget.violation(reference, metric)
        say(
            context.verbose,
            f"confirmation at {confirm_steps} steps: trial {trial.number} "
            f"{'held' if violation <= 0 else 'missed the budget:'} {budget.metric} = "
            f"{'n/a' if metric is None else f'{metric:.6g}'} (float32 {reference:.6g}, "
            f"limit {budget.threshold(reference):.6g})",
        )
        attempts.append(
            {
                "trial": trial.number,
                "label": TrialRecord.from_trial(trial).label,
                "metric": json_safe(metric),
                "violation": json_safe(violation),
                "held": violation <= 0,
            }
        )
        if violation <= 0:
            record["result"] = "held" if trial is ranked[0] else "fell back"
            record["chosen_trial"] = trial.number
            return trial, record
    record["result"] = "fell back to float32"
    logger.warning(
        "autoprec.search: no plan held the budget when trained %d steps; returning float32.",
        confirm_steps,
    )
    return None, record


def add_finalists(context: SearchContext) -> dict[str, Any]:
    """Evaluates Keras' global policies and the best plan with each protection dropped."""
    finalists: dict[str, Any] = {"trials": {}, "same_as": {}, "skipped": {}}
    context.finalists = finalists
    for dtype in (BFLOAT16, FLOAT16, FLOAT8):
        if dtype in context.dtypes:
            _keras_global(context, dtype)
    ranked = ranked_finalists(context, context.study)
    base = ranked[0] if ranked else None
    if base is None:
        finalists["skipped"]["protections"] = "no plan within budget"
    else:
        kinds = protections(context.compute, context.infos, sorted(context.outputs))
        plans, why = dropped_protection(
            context.trial_assignment(base), kinds, context.allowed, context.profile
        )
        finalists["skipped"].update(why)
        finalists["trials"].update(_run_candidates(context, plans))
    finalists["base_trial"] = None if base is None else base.number
    trials, same_as = finalists["trials"], finalists["same_as"]
    named = ", ".join(f"{label} (trial {number})" for label, number in trials.items())
    same = "".join(f"; {label} = {other}" for label, other in same_as.items())
    say(context.verbose, f"finalists {named or 'none'}{same}")
    return finalists


def _keras_global(context: SearchContext, dtype: str) -> None:
    """Finds, or trains and adds, the trial of Keras' global policy for `dtype`."""
    label, study, trials = keras_label(dtype), context.study, context.finalists["trials"]
    plan = keras_global_plan(context, dtype, context.settings.keep_float32)
    compute = {path: plan.dtype_for(path) for path in context.compute}
    completed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    wanted = (label, assignment_key(plan.layers), context.train_steps)
    for trial in completed:
        record = TrialRecord.from_trial(trial)
        if (record.warm_start, record.assignment_key, record.train_steps) == wanted:
            trials[label] = trial.number  # a resumed study trained it already
            return
    if context.plan_for(compute).resolve() == plan.resolve():  # no container: a trial's plan
        for trial in completed:
            record = TrialRecord.from_trial(trial)
            if record.train_steps == context.train_steps and (
                context.trial_assignment(trial) == compute
            ):
                trials[label] = trial.number
                context.finalists["same_as"][label] = record.warm_start or f"trial {trial.number}"
                return
    floor = context.output_floor(compute)
    metrics = None
    if floor is None or not floor.refused:
        try:
            metrics = context.evaluator.train_and_evaluate(plan)
        except tuple(context.settings.catch) as error:
            context.finalists["skipped"][label] = (
                f"training failed: {type(error).__name__}: {error}"
            )
            logger.warning("autoprec.search: %s could not be trained (%s).", label, error)
            return
    trials[label] = _add_trial(context, label, plan.layers, compute, metrics, floor)


def _add_trial(
    context: SearchContext,
    label: str,
    layers: Mapping[str, str],
    compute: Mapping[str, str],
    metrics: Mapping[str, float] | None,
    floor: OutputFloor | None,
) -> int:
    """Adds a judged plan to the study as a completed trial, as the objective records one."""
    study, key = context.study, assignment_key(layers)
    predicted = prediction(context, compute)
    fields = dict(assignment=dict(layers), assignment_key=key, warm_start=label, **predicted)
    attrs: dict[str, Any] = {}
    constraints: dict[str, float] = {}
    if floor is not None:
        attrs["output_floor"] = floor.to_dict()
        constraints["output_floor"] = floor.violation
    if metrics is None:
        record = TrialRecord(
            fidelity=("profile", "floor"), budget_violation=floor.violation, **fields
        )
    else:
        record = judged_record(context, metrics, ("profile", "train"), **fields)
        constraints["budget"] = record.budget_violation
    attrs.update(record.to_user_attrs(with_none=() if metrics is None else ("metric",)))
    study.add_trial(
        optuna.trial.create_trial(
            value=_objective_value(context, compute, predicted["predicted_seconds"]),
            user_attrs=attrs,
            constraints=constraints,
        )
    )
    trials = study.get_trials(deepcopy=False)
    return next(
        t.number for t in reversed(trials) if TrialRecord.from_trial(t).assignment_key == key
    )


def _objective_value(context: SearchContext, compute: Mapping[str, str], seconds: float) -> float:
    """The objective value of a trial of the same assignment, else the predicted seconds."""
    normalised = context.normalise(compute)
    if normalised != dict(compute):
        # Outside the search space (float8 on an output layer, say): no trial evaluated it.
        return float(seconds)
    key = assignment_key(normalised)
    for trial in context.study.get_trials(deepcopy=False):
        if TrialRecord.from_trial(trial).assignment_key != key:
            continue
        value = trial.value if trial.value is not None else trial.intermediate_values.get(COST_STEP)
        if value is not None:
            return float(value)
    return float(seconds)


def _run_candidates(
    context: SearchContext, plans: Mapping[str, Mapping[str, str]]
) -> dict[str, int]:
    """Enqueues the protection-dropped plans and runs the trials up to them; returns their trials."""
    study = context.study
    starts = [
        WarmStart(label, context.normalise(assignment), context.params_for(assignment))
        for label, assignment in plans.items()
    ]
    keys = set(enqueue_candidates(study, starts))
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    mine = [t.number for t in waiting if TrialRecord.from_trial(t).assignment_key in keys]
    if mine:  # the trials queued before them run first (Optuna's queue is first in, first out)
        ahead = sum(trial.number <= max(mine) for trial in waiting)
        optimize(context, ahead)
    wanted = {assignment_key(start.assignment): start.label for start in starts}
    found: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        record = TrialRecord.from_trial(trial)
        label = wanted.get(record.assignment_key or "")
        if label is not None and label not in found and trial.state.is_finished():
            found[label] = trial.number
    return found


def rank_trials(context: SearchContext) -> list[optuna.trial.FrozenTrial]:
    """Ranks the trials within budget (by their measured steps where timed here) into the context."""
    study = context.study
    ranked = ranked_finalists(context, study)
    if not ranked:
        logger.warning(
            "autoprec.search: no plan met the budget in %d trial(s); returning float32.",
            len(study.trials),
        )
    settings = context.settings
    local = settings.costs is None and is_local(context.hardware)
    context.measure = bool(
        settings.measure_speedup if settings.measure_speedup is not None else local
    )
    context.measured = None
    if context.measure and ranked:
        with context.clock.stage("measurement"):
            context.measured = order_by_measurement(context, ranked)
        ranked = list(context.measured.trials)
    context.ranked = ranked
    return ranked


def choose_plan(context: SearchContext) -> SearchResult:
    """Confirms and times the ranking's first plan; returns the `SearchResult` (plan saved)."""
    study, measured = context.study, context.measured
    with context.clock.stage("confirmation"):
        chosen, confirmation = confirm_plan(context, context.ranked, context.settings.confirm_steps)
    plan = context.float32_plan() if chosen is None else finalist_plan(context, chosen)
    metadata = trial_plan_metadata(context, chosen)
    search = dict(metadata.get("search", {}))
    if measured is not None:
        search["measurement"] = measured.to_dict()
        if chosen is not None and chosen.number == measured.replacing_trial:
            search["replaced_by_measurement"] = measured.replaced_by
    metadata["measured_speedup"] = None
    if context.measure:
        with context.clock.stage("measurement"):
            timing = chosen_step_timing(context, chosen, plan, measured)
        search.update(timing)
        metadata["measured_speedup"] = (
            timing["measured_float32_step_seconds"] / timing["measured_plan_step_seconds"]
        )
    if context.finalists is not None:
        search["finalists"] = context.finalists
    metadata["evidence"] = evidence(context)
    search["output_floor"] = context.floor_metadata()
    search.update(
        trial_counts(study),
        wall_seconds=time.perf_counter() - context.started,
        stage_seconds={name: round(value, 3) for name, value in context.clock.seconds.items()},
        fidelity="train",
        warm_starts=warm_start_summary(study),
        confirmation=confirmation,
    )
    metadata["search"] = search
    plan = with_loss_scale_start(plan.with_metadata(**metadata), context.profile)
    if context.settings.plan_path is not None:
        plan.save(context.settings.plan_path)
    return SearchResult(
        plan=plan,
        study=study,
        budget=context.budget,
        reference_metric=context.reference,
        reference_spread=context.spread,
        points=pareto_points(study),
        float32_predicted_seconds=context.float32_seconds,
    )


def evidence(context: SearchContext) -> dict[str, dict]:
    """Returns `{path: {"allowed", "removed", "seconds", "profile", "output_floor"}}`."""
    result: dict[str, dict] = {}
    floors = context.floor_evidence()
    for path in context.compute:
        entry: dict[str, object] = {"allowed": list(context.allowed[path])}
        if path in context.removed:
            entry["removed"] = dict(context.removed[path])
        seconds = {dtype: context.costs.layer_seconds(path, dtype) for dtype in PLAN_DTYPES}
        seconds = {dtype: value for dtype, value in seconds.items() if value is not None}
        if seconds:
            entry["seconds"] = seconds
        if path in context.unsafe:
            entry["profile"] = context.unsafe[path]
        if path in floors:
            entry["output_floor"] = floors[path]
        result[path] = entry
    return result
