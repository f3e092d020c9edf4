"""Local moves around the best plan: flip one group (or layer) at a time, enqueued beside TPE."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping

import optuna

from .._core.dtypes import FLOAT32, widen
from .context import SearchContext
from .record import TrialRecord, assignment_key
from .study import best_feasible, is_feasible

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
    cheaper = _cheaper_moves(context, base, base_seconds)
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
        repairs += _repairs(context, context.trial_assignment(trial), base_seconds)
    repairs.sort(key=lambda n: (-n.score, n.predicted_seconds))
    ordered: list[Neighbour] = []
    for index in range(max(len(cheaper), len(repairs))):
        ordered += [moves[index] for moves in (cheaper, repairs) if index < len(moves)]
    seen: set[str] = set()
    unique = []
    for neighbour in ordered:
        key = assignment_key(neighbour.assignment)
        if key in tried or key in seen:
            continue
        seen.add(key)
        unique.append(neighbour)
    return unique


def _group_risk(context: SearchContext, paths: tuple[str, ...]) -> float:
    return max((context.risk.get(path, 0.0) for path in paths), default=0.0)


def _cheaper_moves(
    context: SearchContext, base: Mapping[str, str], base_seconds: float
) -> list[Neighbour]:
    moves = []
    for group in context.groups:
        for dtype in group.choices:
            if dtype == FLOAT32:
                continue
            flipped = dict(base)
            for path in group.paths:
                flipped[path] = widen(dtype, context.allowed[path])
            if flipped == dict(base):
                continue
            seconds = context.costs.step(flipped)[0]
            gain = base_seconds - seconds
            if gain <= 0:
                continue
            moves.append(
                Neighbour(
                    assignment=flipped,
                    move=f"{group.name} -> {dtype}",
                    predicted_seconds=seconds,
                    score=gain / (1.0 + _group_risk(context, group.paths)),
                )
            )
    return sorted(moves, key=lambda n: (-n.score, n.predicted_seconds))


def _repairs(
    context: SearchContext, assignment: Mapping[str, str], base_seconds: float
) -> list[Neighbour]:
    moves = []
    for group in context.groups:
        if all(assignment.get(path) == FLOAT32 for path in group.paths):
            continue
        repaired = dict(assignment)
        for path in group.paths:
            repaired[path] = FLOAT32
        seconds = context.costs.step(repaired)[0]
        if seconds >= base_seconds:
            continue
        moves.append(
            Neighbour(
                assignment=repaired,
                move=f"{group.name} -> float32",
                predicted_seconds=seconds,
                score=_group_risk(context, group.paths),
            )
        )
    return moves


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
