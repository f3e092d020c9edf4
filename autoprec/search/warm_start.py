"""The plans every study starts with, and enqueueing them once across all its processes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import keras
import optuna

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32
from ..cost import CostTable
from ..hardware import HardwareProfile
from ..profiler import Profile
from .context import SearchContext
from .heuristic import heuristic_plan
from .record import WARM_STARTS_MARK, TrialRecord, assignment_key
from .storage import claim_study_lock, release_study_lock


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """One plan a study starts with."""

    label: str
    assignment: Mapping[str, str]
    params: Mapping[str, str]


def warm_starts(
    context: SearchContext,
    model: keras.Model,
    profile: Profile | None,
    table: CostTable | None,
    hardware: HardwareProfile | str,
    dtypes: Sequence[str],
    keep_float32: Sequence[str],
) -> list[WarmStart]:
    """Returns the plans every study starts with, equal assignments once."""
    plans = [("float32", context.uniform_assignment(FLOAT32))]
    for dtype in (BFLOAT16, FLOAT16, FLOAT8):
        if dtype in dtypes:
            # float8: every Dense/EinsumDense layer that allows it, bfloat16 elsewhere.
            plans.append((f"uniform {dtype}", context.uniform_assignment(dtype)))
    heuristic = heuristic_plan(
        model,
        profile=profile,
        costs=table,
        hardware=hardware,
        dtypes=dtypes,
        keep_float32=keep_float32,
    )
    plans.append(("heuristic", context.normalise(dict(heuristic.layers))))
    unique: list[WarmStart] = []
    for label, assignment in plans:
        if all(assignment != other.assignment for other in unique):
            unique.append(WarmStart(label, assignment, context.params_for(assignment)))
    return unique


def has_warm_starts(study: optuna.Study) -> bool:
    """Whether the study's warm starts were enqueued (its `WARM_STARTS_MARK` is set)."""
    return bool(study.user_attrs.get(WARM_STARTS_MARK))


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
        added = _enqueue_missing(study, starts)
        study.set_user_attr(WARM_STARTS_MARK, True)
        return added
    finally:
        release_study_lock(study, lock)


def _enqueue_missing(study: optuna.Study, starts: Sequence[WarmStart]) -> int:
    trials = study.get_trials(deepcopy=False)
    records = [TrialRecord.from_trial(trial) for trial in trials]
    keys = {record.assignment_key for record in records}
    labels = {record.warm_start for record in records}
    existing = [trial.params for trial in trials if trial.params]
    existing += [
        trial.system_attrs["fixed_params"]
        for trial, record in zip(trials, records)
        if trial.system_attrs.get("fixed_params") and record.assignment_key is None
    ]
    added = 0
    for start in starts:
        key = assignment_key(start.assignment)
        params = dict(start.params)
        if key in keys or start.label in labels or (not keys - {None} and params in existing):
            continue
        record = TrialRecord(
            warm_start=start.label, assignment=start.assignment, assignment_key=key
        )
        study.enqueue_trial(params, user_attrs=record.to_user_attrs(), skip_if_exists=False)
        keys.add(key)
        labels.add(start.label)
        added += 1
    return added


def enqueue_candidates(study: optuna.Study, starts: Sequence[WarmStart]) -> list[str]:
    """Enqueues the plans whose assignment the study has not tried yet; returns their keys."""
    keys = {
        TrialRecord.from_trial(trial).assignment_key for trial in study.get_trials(deepcopy=False)
    }
    added = []
    for start in starts:
        key = assignment_key(start.assignment)
        if key in keys:
            continue
        record = TrialRecord(
            warm_start=start.label, assignment=start.assignment, assignment_key=key
        )
        study.enqueue_trial(
            dict(start.params), user_attrs=record.to_user_attrs(), skip_if_exists=False
        )
        keys.add(key)
        added.append(key)
    return added
