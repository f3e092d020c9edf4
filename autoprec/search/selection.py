"""The search's last stages: finalists, ranking, confirmation and the result."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

import optuna

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, PLAN_DTYPES, count_dtypes
from ..hardware import is_local
from ..plan import PrecisionPlan
from .confirmation import (
    Confirmation,
    MeasuredRanking,
    StepTiming,
    chosen_step_timing,
    confirm_plan,
    dropped_protection,
    finalist_plan,
    keras_global_plan,
    order_by_measurement,
    protections,
    ranked_finalists,
    say,
)
from .context import SearchContext
from .floor import OUTPUT_FLOOR_ATTR, OutputFloor
from .record import TrialRecord, assignment_key, json_safe, keras_label
from .result import SearchResult
from .study import (
    COST_STEP,
    pareto_points,
    plan_writer,
    trial_counts,
    trial_objective,
    trial_plan_metadata,
    warm_start_summary,
)
from .warm_start import WarmStart, enqueue_candidates

logger = logging.getLogger("autoprec")


@dataclasses.dataclass(frozen=True)
class Finalists:
    """What the finalists stage added: the finalists' trials and why others are not."""

    trials: Mapping[str, int]
    same_as: Mapping[str, str]
    skipped: Mapping[str, str]
    base_trial: int | None

    def to_dict(self) -> dict[str, Any]:
        """Returns the record kept in `plan.metadata["search"]["finalists"]`."""
        return {
            "trials": dict(self.trials),
            "same_as": dict(self.same_as),
            "skipped": dict(self.skipped),
            "base_trial": self.base_trial,
        }


def add_finalists(context: SearchContext) -> Finalists:
    """Evaluates Keras' global policies and the best plan with each protection dropped."""
    study = context.study
    trials: dict[str, int] = {}
    same_as: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for dtype in (BFLOAT16, FLOAT16, FLOAT8):
        if dtype in context.dtypes:
            _keras_global(context, study, dtype, trials, same_as, skipped)
    ranked = ranked_finalists(context, study)
    base = ranked[0] if ranked else None
    if base is None:
        skipped["protections"] = "no plan within budget"
    else:
        kinds = protections(context.compute, context.infos, sorted(context.outputs))
        plans, why = dropped_protection(
            context.trial_assignment(base), kinds, context.allowed, context.profile
        )
        skipped.update(why)
        trials.update(_run_candidates(context, plans))
    finalists = Finalists(trials, same_as, skipped, None if base is None else base.number)
    say(
        context.verbose,
        "autoprec.search: finalists %s%s",
        ", ".join(f"{label} (trial {number})" for label, number in trials.items()) or "none",
        "".join(f"; {label} = {other}" for label, other in same_as.items()),
    )
    return finalists


def _keras_global(
    context: SearchContext,
    study: optuna.Study,
    dtype: str,
    trials: dict[str, int],
    same_as: dict[str, str],
    skipped: dict[str, str],
) -> None:
    """Finds, or trains and adds, the trial of Keras' global policy for `dtype`."""
    label = keras_label(dtype)
    plan = keras_global_plan(context, dtype, context.request.settings.keep_float32)
    compute = {path: plan.dtype_for(path) for path in context.compute}
    key = assignment_key(plan.layers)
    completed = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    for trial in completed:
        record = TrialRecord.from_trial(trial)
        steps = record.train_steps
        if (
            record.warm_start == label
            and record.assignment_key == key
            and steps == context.train_steps
        ):
            trials[label] = trial.number  # a resumed study trained it already
            return
    if context.plan_for(compute).resolve() == plan.resolve():  # no container: a trial's plan
        for trial in completed:
            record = TrialRecord.from_trial(trial)
            if record.train_steps == context.train_steps and (
                context.trial_assignment(trial) == compute
            ):
                trials[label] = trial.number
                same_as[label] = record.warm_start or f"trial {trial.number}"
                return
    floor = context.output_floor(compute)
    metrics = None
    if floor is None or not floor.refused:
        try:
            metrics = context.evaluator.train_and_evaluate(plan)
        except tuple(context.request.settings.catch) as error:
            skipped[label] = f"training failed: {type(error).__name__}: {error}"
            logger.warning("autoprec.search: %s could not be trained (%s).", label, error)
            return
    trials[label] = _add_trial(context, study, label, plan.layers, key, compute, metrics, floor)


def _add_trial(
    context: SearchContext,
    study: optuna.Study,
    label: str,
    layers: Mapping[str, str],
    key: str,
    compute: Mapping[str, str],
    metrics: Mapping[str, float] | None,
    floor: OutputFloor | None,
) -> int:
    """Adds a judged plan to the study as a completed trial, as the objective records one."""
    seconds, activation_bytes = context.costs.step(dict(compute))
    record = TrialRecord(
        assignment=dict(layers),
        assignment_key=key,
        train_steps=context.train_steps,
        warm_start=label,
        dtype_counts=count_dtypes(compute.values()),
        predicted_seconds=seconds,
        activation_bytes_per_sample=activation_bytes,
    )
    attrs: dict[str, Any] = {}
    constraints: dict[str, float] = {}
    if floor is not None:
        attrs[OUTPUT_FLOOR_ATTR] = floor.to_dict()
        constraints[OUTPUT_FLOOR_ATTR] = floor.violation
    if metrics is None:
        record = dataclasses.replace(
            record, fidelity=("profile", "floor"), budget_violation=floor.violation
        )
    else:
        metric = metrics.get(context.budget.log_name)
        violation = context.budget.violation(context.reference, metric)
        record = dataclasses.replace(
            record,
            fidelity=("profile", "train"),
            metrics={name: json_safe(value) for name, value in metrics.items()},
            metric=json_safe(metric),
            budget_violation=violation,
        )
        constraints["budget"] = violation
    attrs.update(record.to_user_attrs(with_none=() if metrics is None else ("metric",)))
    study.add_trial(
        optuna.trial.create_trial(
            value=_objective_value(context, study, compute, seconds),
            user_attrs=attrs,
            constraints=constraints,
        )
    )
    added = [
        trial.number
        for trial in study.get_trials(deepcopy=False)
        if TrialRecord.from_trial(trial).assignment_key == key
    ]
    return added[-1]


def _objective_value(
    context: SearchContext, study: optuna.Study, compute: Mapping[str, str], seconds: float
) -> float:
    """The objective value of a trial of `compute`'s assignment (its memory tie-break included),
    else the predicted seconds: a Keras global policy ranks by predicted cost as its trial would."""
    normalised = context.normalise(compute)
    if normalised != dict(compute):
        # Outside the search space (float8 on an output layer, say): no trial evaluated it.
        return float(seconds)
    key = assignment_key(normalised)
    for trial in study.get_trials(deepcopy=False):
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
        settings = context.request.settings
        study.optimize(
            lambda trial: trial_objective(context, trial),
            n_trials=ahead,
            catch=tuple(settings.catch),
            callbacks=[
                plan_writer(context, settings.plan_path, dict(context.metadata)),
                *settings.callbacks,
            ],
            show_progress_bar=False,
        )
    wanted = {assignment_key(start.assignment): start.label for start in starts}
    found: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        record = TrialRecord.from_trial(trial)
        label = wanted.get(record.assignment_key or "")
        if label is not None and label not in found and trial.state.is_finished():
            found[label] = trial.number
    return found


@dataclasses.dataclass(frozen=True)
class Ranking:
    """The trials within budget, first choice first: the ranking stage's value."""

    trials: tuple[optuna.trial.FrozenTrial, ...]
    measured: MeasuredRanking | None
    measure: bool


def rank_trials(context: SearchContext) -> Ranking:
    """Ranks the study's trials within budget, timing the best plans here when asked."""
    study, request = context.study, context.request
    ranked = ranked_finalists(context, study)
    if not ranked:
        logger.warning(
            "autoprec.search: no plan met the budget in %d trial(s); returning float32.",
            len(study.trials),
        )
    settings = request.settings
    local = settings.costs is None and is_local(request.hardware)
    measure = settings.measure_speedup if settings.measure_speedup is not None else local
    if not (measure and ranked):
        return Ranking(tuple(ranked), None, bool(measure))
    with request.clock.stage("measurement"):
        measured = order_by_measurement(context, ranked)
    return Ranking(measured.trials, measured, True)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The plan the search returns, before its final metadata: the confirmation stage's value."""

    trial: optuna.trial.FrozenTrial | None
    plan: PrecisionPlan
    confirmation: Confirmation
    timing: StepTiming | None
    replaced_by: str | None


def choose_plan(context: SearchContext, ranking: Ranking) -> Choice:
    """Confirms the ranking's first plan (falling back down it), then times the chosen one."""
    request = context.request
    settings = request.settings
    with request.clock.stage("confirmation"):
        confirmation = confirm_plan(
            context,
            ranking.trials,
            context.spread,
            request.train_data,
            settings.batch_size,
            settings.confirm_steps,
        )
    chosen = confirmation.chosen
    plan = context.float32_plan() if chosen is None else finalist_plan(context, chosen)
    measured = ranking.measured
    replaced_by = None
    if measured is not None and chosen is not None and chosen.number == measured.replacing_trial:
        replaced_by = measured.replaced_by
    timing = None
    if ranking.measure:
        with request.clock.stage("measurement"):
            timing = chosen_step_timing(context, chosen, plan, measured)
    return Choice(chosen, plan, confirmation, timing, replaced_by)


def build_result(
    context: SearchContext,
    choice: Choice,
    ranking: Ranking | None = None,
    finalists: Finalists | None = None,
) -> SearchResult:
    """Returns the `SearchResult`: the chosen plan with its metadata (saved to `plan_path`)."""
    request, study = context.request, context.study
    metadata = _chosen_metadata(context, choice)
    search = dict(metadata.get("search", {}))
    if choice.replaced_by is not None:
        search["replaced_by_measurement"] = choice.replaced_by
    if ranking is not None and ranking.measured is not None:
        search["measurement"] = ranking.measured.to_dict()
    if finalists is not None:
        search["finalists"] = finalists.to_dict()
    timing = choice.timing
    if timing is not None:
        search.update(
            measured_float32_step_seconds=timing.float32_seconds,
            measured_plan_step_seconds=timing.plan_seconds,
            measured_step_seconds=dict(timing.fastest),
            measured_step_rounds={name: list(f) for name, f in timing.rounds.items()},
        )
    metadata["measured_speedup"] = timing.speedup if timing is not None else None
    metadata["evidence"] = evidence(context)
    search["output_floor"] = context.floor_metadata(study)
    search.update(
        trial_counts(study),
        wall_seconds=time.perf_counter() - request.started,
        stage_seconds={name: round(value, 3) for name, value in request.clock.seconds.items()},
        fidelity="train",
        warm_starts=warm_start_summary(study),
        confirmation=dict(choice.confirmation.record),
    )
    metadata["search"] = search
    plan = choice.plan.with_metadata(**metadata)
    if request.settings.plan_path is not None:
        plan.save(request.settings.plan_path)
    return SearchResult(
        plan=plan,
        study=study,
        budget=context.budget,
        reference_metric=context.reference,
        reference_spread=context.spread,
        points=pareto_points(study),
        float32_predicted_seconds=context.float32_seconds,
    )


def _chosen_metadata(context: SearchContext, choice: Choice) -> dict:
    if choice.trial is not None:
        return trial_plan_metadata(context, choice.trial, dict(context.metadata))
    return {
        **context.metadata,
        "reference_metric": context.reference,
        "measured_metric": context.reference,
        "predicted_speedup": 1.0,
    }


def evidence(context: SearchContext) -> dict[str, dict]:
    """Returns `{path: {"allowed", "removed", "seconds", "profile", "output_floor"}}`: why each
    layer could be what."""
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
