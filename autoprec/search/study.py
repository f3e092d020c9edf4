"""The search's Optuna study: opening it, its pruner, and reading what its trials found."""

from __future__ import annotations

import math

import optuna

from .context import SearchContext
from .record import TrialRecord, assignment_key
from .result import ParetoPoint

#: Steps reported to the pruner: after the cost prediction, after the numerical proxy.
COST_STEP, PROXY_STEP = 0, 1

_COMPLETE = (optuna.trial.TrialState.COMPLETE,)


class FidelityPruner(optuna.pruners.BasePruner):
    """Prunes plans that cannot beat the best plan within budget, or whose proxy is hopeless."""

    def __init__(self, proxy_tolerance: float) -> None:
        self.proxy_tolerance = proxy_tolerance

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        record = TrialRecord.from_trial(trial)
        if step == COST_STEP:
            if record.warm_start:
                return False
            best = best_feasible(study)
            value = trial.intermediate_values.get(COST_STEP)
            return best is not None and value is not None and value >= best.value
        if step == PROXY_STEP:
            score = record.proxy_score
            if score is None or not math.isfinite(score):
                return True
            if record.warm_start:
                return False  # warm starts are judged by training, unless not even finite
            if score > self.proxy_tolerance:
                return True
            return self._worse_than_a_failure(study, score)
        return False

    @staticmethod
    def _worse_than_a_failure(study: optuna.Study, score: float) -> bool:
        passed, failed = [], []
        for other in study.get_trials(deepcopy=False, states=_COMPLETE):
            other_score = TrialRecord.from_trial(other).proxy_score
            if other_score is None:
                continue
            (passed if is_feasible(other) else failed).append(other_score)
        worst_pass = max(passed, default=-math.inf)
        best_fail = min(failed, default=math.inf)
        return score >= best_fail and score > worst_pass


def is_feasible(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial met the budget (every constraint <= 0)."""
    constraints = trial.constraints
    return bool(constraints) and all(value <= 0 for value in constraints.values())


def best_feasible(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """Returns the cheapest completed trial within budget (lowest number among equals)."""
    feasible = [
        trial
        for trial in study.get_trials(deepcopy=False, states=_COMPLETE)
        if is_feasible(trial) and trial.value is not None
    ]
    return min(feasible, key=lambda trial: (trial.value, trial.number), default=None)


def open_study(
    storage: optuna.storages.BaseStorage | None,
    study_name: str | None,
    seed: int | None,
    proxy_tolerance: float,
    sampler: optuna.samplers.BaseSampler | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
) -> tuple[optuna.Study, bool]:
    """Creates the study, or loads it when another run created it; returns `(study, created)`."""
    if sampler is None:
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=6, multivariate=False)
    if pruner is None:
        pruner = FidelityPruner(proxy_tolerance)
    arguments = dict(
        storage=storage, study_name=study_name, sampler=sampler, pruner=pruner, direction="minimize"
    )
    if storage is None:
        return optuna.create_study(**arguments), True
    try:
        return optuna.create_study(load_if_exists=False, **arguments), True
    except optuna.exceptions.DuplicatedStudyError:
        return optuna.load_study(
            study_name=study_name, storage=storage, sampler=sampler, pruner=pruner
        ), False


def ranked_feasible(context: SearchContext, study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Returns the completed trials within budget, cheapest first, one per assignment."""
    feasible = [
        trial
        for trial in study.get_trials(deepcopy=False, states=_COMPLETE)
        if is_feasible(trial) and trial.value is not None
    ]
    ranked, seen = [], set()
    for trial in sorted(feasible, key=lambda t: (t.value, t.number)):
        key = assignment_key(context.trial_assignment(trial))
        if key not in seen:
            seen.add(key)
            ranked.append(trial)
    return ranked


def pareto_points(study: optuna.Study) -> list[ParetoPoint]:
    """Returns a `ParetoPoint` of every completed trial with a predicted cost."""
    points = []
    for trial in study.get_trials(deepcopy=False, states=_COMPLETE):
        record = TrialRecord.from_trial(trial)
        if record.predicted_seconds is None:
            continue
        points.append(
            ParetoPoint(
                trial=trial.number,
                predicted_seconds=float(record.predicted_seconds),
                metric=float(record.metric) if record.metric is not None else math.nan,
                feasible=is_feasible(trial),
                counts=dict(record.dtype_counts or {}),
                label=record.warm_start,
            )
        )
    return points


def warm_start_summary(study: optuna.Study) -> dict[str, dict]:
    """Returns `{label: {trial, state, metric, within_budget, predicted_seconds}}` of the warm
    starts."""
    summary = {}
    for trial in study.get_trials(deepcopy=False):
        record = TrialRecord.from_trial(trial)
        if not record.warm_start or record.warm_start in summary:
            continue
        summary[record.warm_start] = {
            "trial": trial.number,
            "state": trial.state.name,
            "metric": record.metric,
            "within_budget": is_feasible(trial),
            "predicted_seconds": record.predicted_seconds,
        }
    return summary


def trial_counts(study: optuna.Study) -> dict[str, int]:
    """Returns `{"trials", "complete", "pruned", "failed", "reused"}`: the study's trials by
    outcome."""
    trials = study.trials
    states = optuna.trial.TrialState
    return {
        "trials": len(trials),
        "complete": sum(t.state == states.COMPLETE for t in trials),
        "pruned": sum(t.state == states.PRUNED for t in trials),
        "failed": sum(t.state == states.FAIL for t in trials),
        "reused": sum(TrialRecord.from_trial(t).reused for t in trials),
    }
