"""The objective of every trial: a plan's predicted cost, judged at rising fidelity."""

from __future__ import annotations

import math

import keras
import optuna

from .._core.dtypes import FLOAT32, count_dtypes
from .budget import HUGE_VIOLATION
from .context import SearchContext
from .evaluator import ProxyResult
from .floor import OUTPUT_FLOOR_ATTR
from .record import TrainedOutcome, TrialRecord, assignment_key, json_safe, write_record
from .same_assignment import wait_for_same_assignment
from .study import COST_STEP, PROXY_STEP

#: Weight of activation memory in the objective: a tie-break between equally fast plans.
_MEMORY_TIE_BREAK = 1e-3
#: The levels a trial reaches when it reuses another trial's training.
_REUSED_LEVELS = ("profile", "proxy", "train")


def trial_objective(context: SearchContext, trial: optuna.Trial) -> float:
    """Returns a trial's predicted cost after judging its plan; prunes or constrains it."""
    assignment = _suggested_assignment(context, trial)
    key = assignment_key(assignment)
    value = _record_prediction(context, trial, assignment, key)
    floor = context.output_floor(assignment)
    if floor is not None:
        trial.set_user_attr(OUTPUT_FLOOR_ATTR, floor.to_dict())
        trial.set_constraint(OUTPUT_FLOOR_ATTR, floor.violation)
        if floor.refused:
            write_record(
                trial,
                TrialRecord(fidelity=("profile", "floor"), budget_violation=floor.violation),
            )
            return value
    stored = context.cache.get(key) or wait_for_same_assignment(
        trial.study, trial.number, key, context.train_steps
    )
    if stored is not None:
        return _reuse(context, trial, stored, value)
    write_record(trial, TrialRecord(evaluating=trial.number))
    trial.report(value, COST_STEP)
    if trial.should_prune():
        write_record(
            trial, TrialRecord(pruned_by="cost: no faster than the best plan within budget")
        )
        raise optuna.TrialPruned()
    return _train_trial(context, trial, assignment, key, value)


def _suggested_assignment(context: SearchContext, trial: optuna.Trial) -> dict[str, str]:
    """Returns the trial's `{layer path: dtype}`: enqueued as it is, or from its suggestions."""
    params = {
        group.name: trial.suggest_categorical(group.name, list(group.choices))
        for group in context.groups
        if len(group.choices) > 1
    }
    fixed = TrialRecord.from_trial(trial).assignment
    return context.normalise(fixed) if fixed else context.assignment(params)


def _record_prediction(
    context: SearchContext, trial: optuna.Trial, assignment: dict[str, str], key: str
) -> float:
    """Records the trial's assignment and predicted cost; returns the objective value."""
    seconds, activation_bytes = context.costs.step(assignment)
    value = seconds * (1.0 + _MEMORY_TIE_BREAK * activation_bytes / _max_activation(context))
    write_record(
        trial,
        TrialRecord(
            assignment=assignment,
            assignment_key=key,
            train_steps=context.train_steps,
            dtype_counts=count_dtypes(assignment.values()),
            predicted_seconds=seconds,
            activation_bytes_per_sample=activation_bytes,
            fidelity=("profile",),
        ),
    )
    return value


def _train_trial(
    context: SearchContext,
    trial: optuna.Trial,
    assignment: dict[str, str],
    key: str,
    value: float,
) -> float:
    """Runs the proxy (TensorFlow) and the short training of a trial's plan; records the outcome."""
    plan = context.plan_for(assignment)
    levels = ["profile"]
    proxy = None
    if keras.backend.backend() == "tensorflow":
        proxy = _proxy_step(context, trial, plan, value)
        levels.append("proxy")
    else:
        write_record(
            trial, TrialRecord(proxy_skipped="the numerical proxy needs the TensorFlow backend")
        )
    metrics = context.evaluator.train_and_evaluate(plan)
    levels.append("train")
    outcome = TrainedOutcome(
        metrics=metrics,
        proxy=proxy.to_dict() if proxy is not None else None,
        proxy_score=proxy.score if proxy is not None else None,
        trial=trial.number,
    )
    context.cache[key] = outcome
    return _record_outcome(context, trial, outcome, value, levels)


def _proxy_step(context: SearchContext, trial: optuna.Trial, plan, value: float) -> ProxyResult:
    """Runs the numerical proxy, records it and prunes a hopeless plan."""
    proxy = context.evaluator.proxy(plan)
    score = proxy.score if math.isfinite(proxy.score) else None
    write_record(
        trial,
        TrialRecord(fidelity=("profile", "proxy"), proxy=proxy.to_dict(), proxy_score=score),
        with_none=("proxy_score",),
    )
    trial.report(value, PROXY_STEP)
    if trial.should_prune():
        write_record(trial, TrialRecord(pruned_by="proxy: loss/gradients too far from float32"))
        trial.set_constraint("budget", HUGE_VIOLATION if not proxy.finite else 1.0)
        raise optuna.TrialPruned()
    return proxy


def _max_activation(context: SearchContext) -> float:
    _, float32_bytes = context.costs.step({path: FLOAT32 for path in context.compute})
    return max(float32_bytes, 1.0)


def _reuse(
    context: SearchContext, trial: optuna.Trial, outcome: TrainedOutcome, value: float
) -> float:
    """Records a stored outcome of the same assignment instead of training it again."""
    score = outcome.proxy_score
    write_record(
        trial,
        TrialRecord(
            reused=True,
            reused_from=outcome.trial,
            proxy=outcome.proxy,
            proxy_score=score if score is not None and math.isfinite(score) else None,
        ),
        with_none=("proxy", "proxy_score"),
    )
    return _record_outcome(context, trial, outcome, value, _REUSED_LEVELS)


def _record_outcome(
    context: SearchContext,
    trial: optuna.Trial,
    outcome: TrainedOutcome,
    value: float,
    levels: tuple[str, ...] | list[str],
) -> float:
    metric = outcome.metrics.get(context.budget.log_name)
    violation = context.budget.violation(context.reference, metric)
    write_record(
        trial,
        TrialRecord(
            fidelity=tuple(levels),
            metrics={name: json_safe(v) for name, v in outcome.metrics.items()},
            metric=json_safe(metric),
            budget_violation=violation,
        ),
        with_none=("metric",),
    )
    trial.set_constraint("budget", violation)
    return value
