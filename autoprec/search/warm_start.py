"""The study's first trials (uniform plans, the heuristic) and the neighbours explored from the best plan."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence

import optuna

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32, widen
from .context import SearchContext
from .heuristic import heuristic_plan
from .result import TrialRecord, assignment_key
from .study import best_feasible, claim_study_lock, is_feasible, release_study_lock


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """One plan a study starts with."""

    label: str
    assignment: Mapping[str, str]
    params: Mapping[str, str]


def warm_starts(context: SearchContext) -> list[WarmStart]:
    """Returns the plans every study starts with, equal assignments once."""
    plans = [("float32", context.uniform_assignment(FLOAT32))]
    for dtype in (BFLOAT16, FLOAT16, FLOAT8):
        if dtype in context.dtypes:
            # float8: every Dense/EinsumDense layer that allows it, bfloat16 elsewhere.
            plans.append((f"uniform {dtype}", context.uniform_assignment(dtype)))
    heuristic = heuristic_plan(
        context.model,
        profile=context.profile,
        costs=context.table,
        hardware=context.hardware_profile or context.request.hardware,
        dtypes=context.dtypes,
        keep_float32=context.request.settings.keep_float32,
    )
    plans.append(("heuristic", context.normalise(dict(heuristic.layers))))
    unique: list[WarmStart] = []
    for label, assignment in plans:
        if all(assignment != other.assignment for other in unique):
            unique.append(WarmStart(label, assignment, context.params_for(assignment)))
    return unique


def has_warm_starts(study: optuna.Study) -> bool:
    """Whether the study's warm starts were enqueued (its `"warm_starts_enqueued"` is set)."""
    return bool(study.user_attrs.get("warm_starts_enqueued"))


def enqueue_warm_starts(study: optuna.Study, starts: Sequence[WarmStart]) -> int:
    """Enqueues the warm starts not already in the study; returns how many."""
    if has_warm_starts(study):
        return 0
    lock = claim_study_lock(study, "warm-starts")
    if lock is None:
        return 0
    try:
        if has_warm_starts(study):  # another process finished and released the lock meanwhile
            return 0
        added = len(enqueue_candidates(study, starts, warm=True))
        study.set_user_attr("warm_starts_enqueued", True)
        return added
    finally:
        release_study_lock(study, lock)


def enqueue_candidates(
    study: optuna.Study, starts: Sequence[WarmStart], *, warm: bool = False
) -> list[str]:
    """Enqueues the plans not tried yet (warm starts: nor their label); returns their keys."""
    trials = study.get_trials(deepcopy=False)
    records = [TrialRecord.from_trial(trial) for trial in trials]
    keys = {record.assignment_key for record in records}
    labels = {record.warm_start for record in records}
    existing = []
    if warm and not keys - {None}:  # a study without keys: its params tell what was tried
        existing = [trial.params for trial in trials if trial.params]
        existing += [
            t.system_attrs["fixed_params"] for t in trials if "fixed_params" in t.system_attrs
        ]
    added = []
    for start in starts:
        key = assignment_key(start.assignment)
        if key in keys or (warm and start.label in labels) or dict(start.params) in existing:
            continue
        record = TrialRecord(
            warm_start=start.label, assignment=start.assignment, assignment_key=key
        )
        study.enqueue_trial(
            dict(start.params), user_attrs=record.to_user_attrs(), skip_if_exists=False
        )
        keys.add(key)
        labels.add(start.label)
        added.append(key)
    return added


logger = logging.getLogger("autoprec")

#: Neighbour trials run back to back before TPE proposes the next trial.
_NEIGHBOURS_IN_A_ROW = 2
#: Faster plans that missed the budget whose groups are put back to float32 one at a time.
_REPAIRED_PLANS = 2


@dataclasses.dataclass(frozen=True)
class Neighbour:
    """A plan one move away from another, with why it is worth training."""

    assignment: dict[str, str]
    move: str
    predicted_seconds: float
    score: float


def neighbours(context: SearchContext, study: optuna.Study) -> list[Neighbour]:
    """Returns the untried neighbours of the study's best plan within budget, best first."""
    trials = study.get_trials(deepcopy=False)
    records = {trial.number: TrialRecord.from_trial(trial) for trial in trials}
    tried = {record.assignment_key for record in records.values()}
    best = best_feasible(study)
    base = (
        context.trial_assignment(best) if best is not None else context.uniform_assignment(FLOAT32)
    )
    base_seconds = context.costs.step(base)[0]
    cheaper = _moves(context, base, base_seconds, repair=False)
    missed = sorted(
        (
            trial
            for trial in trials
            if trial.state == optuna.trial.TrialState.COMPLETE
            and not is_feasible(trial)
            and (records[trial.number].predicted_seconds or base_seconds) < base_seconds
        ),
        key=lambda trial: records[trial.number].predicted_seconds,
    )
    repairs: list[Neighbour] = []
    for trial in missed[:_REPAIRED_PLANS]:
        repairs += _moves(context, context.trial_assignment(trial), base_seconds, repair=True)
    repairs.sort(key=_best_first)
    unique: dict[str, Neighbour] = {}
    for neighbour in itertools.chain(*itertools.zip_longest(cheaper, repairs)):
        key = assignment_key(neighbour.assignment) if neighbour is not None else None
        if key is not None and key not in tried:
            unique.setdefault(key, neighbour)
    return list(unique.values())


def _moves(
    context: SearchContext, assignment: Mapping[str, str], base_seconds: float, repair: bool
) -> list[Neighbour]:
    """Faster plans one group away: to a cheaper dtype, or (`repair`) back to float32."""
    moves = []
    for group in context.groups:
        for dtype in (FLOAT32,) if repair else [d for d in group.choices if d != FLOAT32]:
            flipped = {**assignment, **{p: widen(dtype, context.allowed[p]) for p in group.paths}}
            if flipped == dict(assignment):
                continue
            seconds = context.costs.step(flipped)[0]
            if seconds >= base_seconds:
                continue
            risk = max((context.risk.get(path, 0.0) for path in group.paths), default=0.0)
            score = risk if repair else (base_seconds - seconds) / (1.0 + risk)
            moves.append(Neighbour(flipped, f"{group.name} -> {dtype}", seconds, score))
    return sorted(moves, key=_best_first)


def _best_first(neighbour: Neighbour) -> tuple[float, float]:
    return -neighbour.score, neighbour.predicted_seconds


def explorer(
    context: SearchContext,
) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """Returns the Optuna callback that enqueues the next neighbour when the queue is empty."""

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        trials = study.get_trials(deepcopy=False)
        if any(other.state == optuna.trial.TrialState.WAITING for other in trials):
            return
        finished = [other for other in trials if other.state.is_finished()]
        recent = finished[-_NEIGHBOURS_IN_A_ROW:]
        if len(recent) == _NEIGHBOURS_IN_A_ROW and all(
            TrialRecord.from_trial(other).neighbour for other in recent
        ):
            return
        found = neighbours(context, study)
        if not found:
            return
        chosen = found[0]
        record = TrialRecord(
            neighbour=chosen.move,
            assignment=chosen.assignment,
            assignment_key=assignment_key(chosen.assignment),
        )
        study.enqueue_trial(
            context.params_for(chosen.assignment),
            user_attrs=record.to_user_attrs(),
            skip_if_exists=False,
        )
        if context.verbose:
            logger.info(
                "autoprec.search: next trial explores %s (predicted %.3f ms)",
                chosen.move,
                chosen.predicted_seconds * 1e3,
            )

    return callback
