"""The search's last stages: rank the trials within budget, confirm the choice, build the result."""

from __future__ import annotations

import dataclasses
import logging
import time

import optuna

from .._core.dtypes import PLAN_DTYPES
from ..hardware import is_local
from ..plan import PrecisionPlan
from .candidates import finalist_plan, ranked_finalists
from .confirmation import (
    Confirmation,
    MeasuredRanking,
    StepTiming,
    chosen_step_timing,
    confirm_plan,
    order_by_measurement,
)
from .context import SearchContext
from .finalists import Finalists
from .plan_writer import trial_plan_metadata
from .preparation import ReferenceCheck, SearchSpace
from .request import SearchRequest
from .result import SearchResult
from .study import pareto_points, trial_counts, warm_start_summary
from .trials import TrialsRun

logger = logging.getLogger("autoprec")


@dataclasses.dataclass(frozen=True)
class Ranking:
    """The trials within budget, first choice first: the ranking stage's value."""

    trials: tuple[optuna.trial.FrozenTrial, ...]
    measured: MeasuredRanking | None
    measure: bool


def rank_trials(context: SearchContext, study: optuna.Study, request: SearchRequest) -> Ranking:
    """Ranks the study's trials within budget, timing the best plans here when asked."""
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


def choose_plan(
    context: SearchContext, ranking: Ranking, reference: ReferenceCheck, request: SearchRequest
) -> Choice:
    """Confirms the ranking's first plan (falling back down it), then times the chosen one."""
    settings = request.settings
    with request.clock.stage("confirmation"):
        confirmation = confirm_plan(
            context,
            ranking.trials,
            reference.spread,
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
    space: SearchSpace,
    reference: ReferenceCheck,
    run: TrialsRun,
    choice: Choice,
    request: SearchRequest,
    ranking: Ranking | None = None,
    finalists: Finalists | None = None,
) -> SearchResult:
    """Returns the `SearchResult`: the chosen plan with its metadata (saved to `plan_path`)."""
    metadata = _chosen_metadata(context, run, choice)
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
    metadata["evidence"] = evidence(context, space)
    search["output_floor"] = context.floor_metadata(run.study)
    search.update(
        trial_counts(run.study),
        wall_seconds=time.perf_counter() - request.started,
        stage_seconds={name: round(value, 3) for name, value in request.clock.seconds.items()},
        fidelity="train",
        warm_starts=warm_start_summary(run.study),
        confirmation=dict(choice.confirmation.record),
    )
    metadata["search"] = search
    plan = choice.plan.with_metadata(**metadata)
    if request.settings.plan_path is not None:
        plan.save(request.settings.plan_path)
    return SearchResult(
        plan=plan,
        study=run.study,
        budget=context.budget,
        reference_metric=context.reference,
        reference_spread=reference.spread,
        points=pareto_points(run.study),
        float32_predicted_seconds=context.float32_seconds,
    )


def _chosen_metadata(context: SearchContext, run: TrialsRun, choice: Choice) -> dict:
    if choice.trial is not None:
        return trial_plan_metadata(context, choice.trial, dict(run.metadata))
    return {
        **run.metadata,
        "reference_metric": context.reference,
        "measured_metric": context.reference,
        "predicted_speedup": 1.0,
    }


def evidence(context: SearchContext, space: SearchSpace) -> dict[str, dict]:
    """Returns `{path: {"allowed", "removed", "seconds", "profile", "output_floor"}}`: why each
    layer could be what."""
    result: dict[str, dict] = {}
    floors = context.floor_evidence()
    for path in context.compute:
        entry: dict[str, object] = {"allowed": list(context.allowed[path])}
        if path in space.removed:
            entry["removed"] = dict(space.removed[path])
        seconds = {dtype: context.costs.layer_seconds(path, dtype) for dtype in PLAN_DTYPES}
        seconds = {dtype: value for dtype, value in seconds.items() if value is not None}
        if seconds:
            entry["seconds"] = seconds
        if path in space.unsafe:
            entry["profile"] = space.unsafe[path]
        if path in floors:
            entry["output_floor"] = floors[path]
        result[path] = entry
    return result
