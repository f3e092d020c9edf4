"""Optuna plumbing of the search: storage, study creation and resume, trials, constraints.

A trial proposes one dtype per group, and runs the plan at rising fidelity: its
predicted cost (pruned when no faster than the best plan within budget), the
numerical proxy (pruned when hopeless), then short training, whose budget
violation is the trial's constraint (`trial.set_constraint`, read by the seeded
`TPESampler`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import keras
import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from .._core.dtypes import FLOAT32, count_dtypes, widen
from ..layers import LayerInfo
from ..plan import PrecisionPlan
from .budget import _HUGE_VIOLATION, Budget
from .evaluator import Evaluator
from .heuristic import _Costs
from .result import ParetoPoint, _counts_text
from .space import Group, _plan_from_assignment

logger = logging.getLogger("autoprec")

#: Weight of activation memory in the objective: a tie-break between equally fast plans.
_MEMORY_TIE_BREAK = 1e-3
#: Steps reported to the pruner: after the cost prediction, after the numerical proxy.
_COST_STEP, _PROXY_STEP = 0, 1


def resolve_storage(
    storage: str | os.PathLike | optuna.storages.BaseStorage | None,
) -> str | optuna.storages.BaseStorage | None:
    """Returns what Optuna takes for a `storage=` argument: journal files become a `JournalStorage`.

    Args:
        storage: a database URL (`"sqlite:///autoprec.db"`, PostgreSQL), a journal
            file (`"journal:///path/file.log"` or any path ending `.log`), a storage
            object, or `None` (in memory).

    Returns:
        A `JournalStorage` for journal files; otherwise `storage` as given.

    Example:

    ```python
    study = optuna.load_study(study_name="mlp", storage=resolve_storage("search.log"))
    ```
    """
    if storage is None or not isinstance(storage, (str, os.PathLike)):
        return storage
    text = os.fspath(storage)
    if text.startswith("journal://"):
        text = text[len("journal://") :]
        if text.startswith("/") and text.startswith("//"):
            text = text[1:]
    elif not text.endswith(".log"):
        return text
    return JournalStorage(JournalFileBackend(text))


class _FidelityPruner(optuna.pruners.BasePruner):
    """Prunes plans that cannot beat the best plan within budget, or whose proxy is hopeless.

    After the cost step: a non-warm-start plan predicted no faster than the best feasible
    plan so far is pruned. After the proxy step: non-finite loss or gradients, a proxy
    error above `proxy_tolerance`, or one at least as bad as that of a plan that already
    missed the budget (and worse than every plan that met it) is pruned.
    """

    def __init__(self, proxy_tolerance: float) -> None:
        self.proxy_tolerance = proxy_tolerance

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step == _COST_STEP:
            if trial.user_attrs.get("warm_start"):
                return False
            best = _best_feasible(study)
            value = trial.intermediate_values.get(_COST_STEP)
            return best is not None and value is not None and value >= best.value
        if step == _PROXY_STEP:
            score = trial.user_attrs.get("proxy_score")
            if score is None or not math.isfinite(score):
                return True
            if score > self.proxy_tolerance:
                return True
            passed, failed = [], []
            for other in study.get_trials(
                deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)
            ):
                other_score = other.user_attrs.get("proxy_score")
                if other_score is None:
                    continue
                (passed if _is_feasible(other) else failed).append(other_score)
            worst_pass = max(passed, default=-math.inf)
            best_fail = min(failed, default=math.inf)
            return score >= best_fail and score > worst_pass
        return False


def _is_feasible(trial: optuna.trial.FrozenTrial) -> bool:
    constraints = trial.constraints
    return bool(constraints) and all(value <= 0 for value in constraints.values())


def _best_feasible(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    feasible = [
        trial
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if _is_feasible(trial) and trial.value is not None
    ]
    return min(feasible, key=lambda trial: (trial.value, trial.number), default=None)


def _open_study(
    storage: str | optuna.storages.BaseStorage | None,
    study_name: str | None,
    seed: int | None,
    proxy_tolerance: float,
) -> tuple[optuna.Study, bool]:
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=6, multivariate=False)
    pruner = _FidelityPruner(proxy_tolerance)
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


def _enqueue_warm_starts(study: optuna.Study, warm: list[tuple[str, dict[str, str]]]) -> int:
    """Enqueues warm-start plans not already in the study (any state); returns how many."""
    existing = [trial.params for trial in study.get_trials(deepcopy=False)]
    existing += [
        trial.system_attrs.get("fixed_params")
        for trial in study.get_trials(deepcopy=False)
        if trial.system_attrs.get("fixed_params")
    ]
    added = 0
    for label, params in warm:
        if any(params == other for other in existing):
            continue
        study.enqueue_trial(params, user_attrs={"warm_start": label})
        existing.append(params)
        added += 1
    return added


@dataclasses.dataclass
class _Context:
    """Everything a trial needs, built once per `search()` call."""

    model: keras.Model
    infos: Mapping[str, LayerInfo]
    compute: list[str]
    groups: list[Group]
    allowed: dict[str, tuple[str, ...]]
    evaluator: Evaluator
    costs: _Costs
    budget: Budget
    reference: float
    float32_seconds: float
    verbose: int
    cache: dict[tuple, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def assignment(self, params: Mapping[str, str]) -> dict[str, str]:
        dtypes = {}
        for group in self.groups:
            choice = params.get(group.name, group.choices[0])
            for path in group.paths:
                dtypes[path] = widen(choice, self.allowed[path])
        return dtypes

    def plan(self, params: Mapping[str, str], **kwargs: object) -> PrecisionPlan:
        return _plan_from_assignment(self.model, self.infos, self.assignment(params), **kwargs)

    def uniform_params(self, dtype: str) -> dict[str, str]:
        return {
            group.name: widen(dtype, group.choices)
            for group in self.groups
            if len(group.choices) > 1
        }


def _objective(context: _Context, trial: optuna.Trial) -> float:
    params = {
        group.name: trial.suggest_categorical(group.name, list(group.choices))
        for group in context.groups
        if len(group.choices) > 1
    }
    assignment = context.assignment(params)
    counts = count_dtypes(assignment.values())
    seconds, activation_bytes = context.costs.step(assignment)
    value = seconds * (1.0 + _MEMORY_TIE_BREAK * activation_bytes / _max_activation(context))
    trial.set_user_attr("dtype_counts", counts)
    trial.set_user_attr("predicted_seconds", seconds)
    trial.set_user_attr("activation_bytes_per_sample", activation_bytes)
    levels = ["profile"]
    trial.set_user_attr("fidelity", levels)
    key = tuple(sorted(assignment.items()))
    if key in context.cache:
        return _reuse(context, trial, context.cache[key], value)
    trial.report(value, _COST_STEP)
    if trial.should_prune():
        trial.set_user_attr("pruned_by", "cost: no faster than the best plan within budget")
        raise optuna.TrialPruned()

    plan = context.plan(params)
    proxy = None
    if keras.backend.backend() == "tensorflow":
        proxy = context.evaluator.proxy(plan)
        levels.append("proxy")
        trial.set_user_attr("fidelity", levels)
        trial.set_user_attr("proxy", proxy.to_dict())
        trial.set_user_attr("proxy_score", proxy.score if math.isfinite(proxy.score) else None)
        trial.report(value, _PROXY_STEP)
        if trial.should_prune():
            trial.set_user_attr("pruned_by", "proxy: loss/gradients too far from float32")
            trial.set_constraint("budget", _HUGE_VIOLATION if not proxy.finite else 1.0)
            raise optuna.TrialPruned()
    else:
        trial.set_user_attr("proxy_skipped", "the numerical proxy needs the TensorFlow backend")

    metrics = context.evaluator.train_and_evaluate(plan)
    levels.append("train")
    outcome = {
        "metrics": metrics,
        "proxy": proxy.to_dict() if proxy is not None else None,
        "proxy_score": proxy.score if proxy is not None else None,
    }
    context.cache[key] = outcome
    return _record_outcome(context, trial, outcome, value, levels)


def _max_activation(context: _Context) -> float:
    _, float32_bytes = context.costs.step({path: FLOAT32 for path in context.compute})
    return max(float32_bytes, 1.0)


def _reuse(context: _Context, trial: optuna.Trial, outcome: dict, value: float) -> float:
    trial.set_user_attr("reused", True)
    trial.set_user_attr("proxy", outcome.get("proxy"))
    score = outcome.get("proxy_score")
    trial.set_user_attr(
        "proxy_score", score if score is not None and math.isfinite(score) else None
    )
    return _record_outcome(context, trial, outcome, value, ["profile", "proxy", "train"])


def _record_outcome(
    context: _Context, trial: optuna.Trial, outcome: dict, value: float, levels: list[str]
) -> float:
    metric = outcome["metrics"].get(context.budget.log_name)
    violation = context.budget.violation(context.reference, metric)
    trial.set_user_attr("fidelity", levels)
    trial.set_user_attr("metrics", {k: _json_safe(v) for k, v in outcome["metrics"].items()})
    trial.set_user_attr("metric", _json_safe(metric))
    trial.set_user_attr("budget_violation", violation)
    trial.set_constraint("budget", violation)
    return value


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _log_trial(context: _Context, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    if not context.verbose:
        return
    attrs = trial.user_attrs
    counts = attrs.get("dtype_counts") or {}
    fidelity = (attrs.get("fidelity") or ["-"])[-1]
    metric = attrs.get("metric")
    seconds = attrs.get("predicted_seconds")
    verdict = {
        optuna.trial.TrialState.COMPLETE: "ok" if _is_feasible(trial) else "over budget",
        optuna.trial.TrialState.PRUNED: f"pruned ({attrs.get('pruned_by', '')})",
        optuna.trial.TrialState.FAIL: "failed",
    }.get(trial.state, str(trial.state))
    logger.info(
        "trial %d: %s | fidelity %s | %s %s | predicted %s%s | %s",
        trial.number,
        _counts_text(counts),
        fidelity,
        context.budget.metric,
        f"{metric:.6g}" if isinstance(metric, (int, float)) else "n/a",
        f"{seconds * 1e3:.3f} ms" if isinstance(seconds, (int, float)) else "n/a",
        f" (x{context.float32_seconds / seconds:.2f})" if seconds else "",
        verdict,
    )


def _plan_writer(
    context: _Context, plan_path: str | os.PathLike | None, metadata: dict
) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """Returns the Optuna callback that logs each trial and saves the best plan so far."""
    written: dict[str, int | None] = {"number": None}

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        _log_trial(context, study, trial)
        if plan_path is None:
            return
        best = _best_feasible(study)
        if best is None or best.number == written["number"]:
            return
        plan = context.plan(best.params, metadata=_trial_metadata(context, best, metadata))
        plan.save(plan_path)
        written["number"] = best.number
        logger.info(
            "autoprec.search: best plan so far (trial %d) written to %s", best.number, plan_path
        )

    return callback


def _trial_metadata(context: _Context, trial: optuna.trial.FrozenTrial, base: dict) -> dict:
    seconds = trial.user_attrs.get("predicted_seconds")
    return {
        **base,
        "reference_metric": context.reference,
        "measured_metric": trial.user_attrs.get("metric"),
        "predicted_speedup": (context.float32_seconds / seconds) if seconds else None,
        "search": {**base.get("search", {}), "best_trial": trial.number},
    }


def _points(context: _Context, study: optuna.Study) -> list[ParetoPoint]:
    points = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        metric = trial.user_attrs.get("metric")
        seconds = trial.user_attrs.get("predicted_seconds")
        if seconds is None:
            continue
        points.append(
            ParetoPoint(
                trial=trial.number,
                predicted_seconds=float(seconds),
                metric=float(metric) if metric is not None else math.nan,
                feasible=_is_feasible(trial),
                counts=dict(trial.user_attrs.get("dtype_counts") or {}),
            )
        )
    return points
