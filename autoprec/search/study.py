"""Optuna plumbing of the search: storage, study creation and resume, trials, constraints.

A trial proposes one dtype per group (sampled by TPE), or carries a whole per-layer
assignment in its user attrs (warm starts and neighbours of the best plan, enqueued
as fixed-params trials), and runs the plan at rising fidelity: its predicted cost
(pruned when no faster than the best plan within budget), the numerical proxy
(pruned when hopeless), then short training, whose budget violation is the trial's
constraint (`trial.set_constraint`, read by the seeded `TPESampler`). Every trial
records its effective per-layer assignment (`"assignment"`, `"assignment_key"`); an
assignment already trained at the same fidelity is reused, never trained twice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
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
            if trial.user_attrs.get("warm_start"):
                return False  # warm starts are judged by training, unless not even finite
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
    sampler: optuna.samplers.BaseSampler | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
) -> tuple[optuna.Study, bool]:
    if sampler is None:
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=6, multivariate=False)
    if pruner is None:
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


#: How long a process that did not create the study waits for its creator's warm starts.
_WARM_START_WAIT_SECONDS = 30.0
_WARM_STARTS_ATTR = "warm_starts_enqueued"


def _assignment_key(assignment: Mapping[str, str]) -> str:
    """Returns a short stable digest of a per-layer assignment (equal assignments, equal keys)."""
    text = json.dumps(sorted(assignment.items()), separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def _enqueue_warm_starts(
    study: optuna.Study,
    warm: Sequence[tuple[str, Mapping[str, str], Mapping[str, str]]],
    created: bool,
) -> int:
    """Enqueues `(label, assignment, params)` warm starts not already in the study; returns how many.

    Only the process that created the study enqueues them; a process that loaded it
    waits (up to `_WARM_START_WAIT_SECONDS`) for the creator's mark, and enqueues the
    missing ones itself only when the mark never comes (a creator killed before it
    finished), so that workers sharing one study enqueue each warm start once.
    """
    if not created:
        deadline = time.monotonic() + _WARM_START_WAIT_SECONDS
        while not study.user_attrs.get(_WARM_STARTS_ATTR):
            if time.monotonic() > deadline:
                logger.info(
                    "autoprec.search: study %r has no warm-start mark; enqueueing missing ones.",
                    study.study_name,
                )
                break
            time.sleep(0.2)
        else:
            return 0
    trials = study.get_trials(deepcopy=False)
    keys = {trial.user_attrs.get("assignment_key") for trial in trials}
    labels = {trial.user_attrs.get("warm_start") for trial in trials}
    existing = [trial.params for trial in trials if trial.params]
    existing += [
        trial.system_attrs["fixed_params"]
        for trial in trials
        if trial.system_attrs.get("fixed_params") and "assignment_key" not in trial.user_attrs
    ]
    added = 0
    for label, assignment, params in warm:
        key = _assignment_key(assignment)
        if key in keys or label in labels or (not keys - {None} and dict(params) in existing):
            continue
        study.enqueue_trial(
            dict(params),
            user_attrs={"warm_start": label, "assignment": dict(assignment), "assignment_key": key},
            skip_if_exists=False,
        )
        keys.add(key)
        labels.add(label)
        added += 1
    study.set_user_attr(_WARM_STARTS_ATTR, True)
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
    risk: dict[str, float] = dataclasses.field(default_factory=dict)
    cache: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def train_steps(self) -> int:
        """The search's fidelity: training steps of every trial."""
        return len(self.evaluator.train_batches)

    def assignment(self, params: Mapping[str, str]) -> dict[str, str]:
        dtypes = {}
        for group in self.groups:
            choice = params.get(group.name, group.choices[0])
            for path in group.paths:
                dtypes[path] = widen(choice, self.allowed[path])
        return dtypes

    def normalise(self, assignment: Mapping[str, str]) -> dict[str, str]:
        """Returns `{compute path: dtype}`: float32 where missing, widened to what each layer allows."""
        return {
            path: widen(assignment.get(path, FLOAT32), self.allowed[path]) for path in self.compute
        }

    def params_for(self, assignment: Mapping[str, str]) -> dict[str, str]:
        """Returns the group parameters closest to a per-layer assignment (each group's majority)."""
        params = {}
        for group in self.groups:
            if len(group.choices) <= 1:
                continue
            chosen = [assignment.get(path, FLOAT32) for path in group.paths]
            params[group.name] = max(
                group.choices, key=lambda dtype: (chosen.count(dtype), dtype == FLOAT32)
            )
        return params

    def uniform_assignment(self, dtype: str) -> dict[str, str]:
        return {path: widen(dtype, self.allowed[path]) for path in self.compute}

    def plan(self, params: Mapping[str, str], **kwargs: object) -> PrecisionPlan:
        return self.plan_for(self.assignment(params), **kwargs)

    def plan_for(self, assignment: Mapping[str, str], **kwargs: object) -> PrecisionPlan:
        return _plan_from_assignment(self.model, self.infos, self.normalise(assignment), **kwargs)

    def trial_assignment(self, trial: optuna.trial.FrozenTrial) -> dict[str, str]:
        """Returns the per-layer assignment a trial evaluated (its user attr, else its params)."""
        stored = trial.user_attrs.get("assignment")
        if stored:
            return self.normalise(stored)
        return self.assignment(trial.params)

    def trial_plan(self, trial: optuna.trial.FrozenTrial, **kwargs: object) -> PrecisionPlan:
        return self.plan_for(self.trial_assignment(trial), **kwargs)

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
    fixed = trial.user_attrs.get("assignment")
    assignment = context.normalise(fixed) if fixed else context.assignment(params)
    key = _assignment_key(assignment)
    trial.set_user_attr("assignment", assignment)
    trial.set_user_attr("assignment_key", key)
    trial.set_user_attr("train_steps", context.train_steps)
    counts = count_dtypes(assignment.values())
    seconds, activation_bytes = context.costs.step(assignment)
    value = seconds * (1.0 + _MEMORY_TIE_BREAK * activation_bytes / _max_activation(context))
    trial.set_user_attr("dtype_counts", counts)
    trial.set_user_attr("predicted_seconds", seconds)
    trial.set_user_attr("activation_bytes_per_sample", activation_bytes)
    levels = ["profile"]
    trial.set_user_attr("fidelity", levels)
    stored = context.cache.get(key) or _stored_outcome(trial.study, key, context.train_steps)
    if stored is not None:
        return _reuse(context, trial, stored, value)
    trial.report(value, _COST_STEP)
    if trial.should_prune():
        trial.set_user_attr("pruned_by", "cost: no faster than the best plan within budget")
        raise optuna.TrialPruned()

    plan = context.plan_for(assignment)
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
        "trial": trial.number,
    }
    context.cache[key] = outcome
    return _record_outcome(context, trial, outcome, value, levels)


def _stored_outcome(study: optuna.Study, key: str, train_steps: int) -> dict[str, Any] | None:
    """Returns the outcome of a completed trial of the study that trained the same assignment."""
    for other in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        attrs = other.user_attrs
        if attrs.get("assignment_key") != key or attrs.get("train_steps") != train_steps:
            continue
        if "metrics" not in attrs or attrs.get("reused_from") is not None:
            continue
        metrics = {
            name: (math.nan if value is None else float(value))
            for name, value in attrs["metrics"].items()
        }
        return {
            "metrics": metrics,
            "proxy": attrs.get("proxy"),
            "proxy_score": attrs.get("proxy_score"),
            "trial": other.number,
        }
    return None


def _max_activation(context: _Context) -> float:
    _, float32_bytes = context.costs.step({path: FLOAT32 for path in context.compute})
    return max(float32_bytes, 1.0)


def _reuse(context: _Context, trial: optuna.Trial, outcome: dict, value: float) -> float:
    """Records a stored outcome of the same assignment instead of training it again."""
    trial.set_user_attr("reused", True)
    trial.set_user_attr("reused_from", outcome.get("trial"))
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
        plan = context.trial_plan(best, metadata=_trial_metadata(context, best, metadata))
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
                label=trial.user_attrs.get("warm_start"),
            )
        )
    return points
