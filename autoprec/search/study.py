"""The Optuna study: storages shared by processes, the pruner, the trial objective, what its trials
found, the plans it starts with (uniform, the heuristic) and the neighbours it explores."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import keras
import optuna
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32, count_dtypes, widen
from ..errors import AutoprecError
from .budget import HUGE_VIOLATION, json_safe
from .context import SearchContext
from .heuristic import heuristic_plan
from .result import ParetoPoint, TrialRecord, assignment_key, short_counts_text, write_record

logger = logging.getLogger("autoprec")

_COMPLETE = (optuna.trial.TrialState.COMPLETE,)

#: Database storages: seconds between two heartbeats of a running trial.
HEARTBEAT_INTERVAL_SECONDS = 60
#: Times a trial whose process died (stale heartbeat) is enqueued again.
_STALE_TRIAL_RETRIES = 2
#: Attempts at opening a database whose tables another process is creating at the same time.
_SCHEMA_ATTEMPTS = 5


def resolve_storage(
    storage: str | os.PathLike | optuna.storages.BaseStorage | None,
    *,
    heartbeat_interval: int | None = HEARTBEAT_INTERVAL_SECONDS,
    grace_period: int | None = None,
) -> optuna.storages.BaseStorage | None:
    """Returns the Optuna storage for a `storage=` argument: journal files and database URLs opened."""
    if storage is None or not isinstance(storage, (str, os.PathLike)):
        return storage
    text = os.fspath(storage)
    if text.startswith("journal://"):
        text = text[len("journal://") :]
        if text.startswith("//"):
            text = text[1:]
    elif not text.endswith(".log"):
        return _database_storage(text, heartbeat_interval, grace_period)
    return JournalStorage(JournalFileBackend(text))


def _database_storage(
    url: str, heartbeat_interval: int | None, grace_period: int | None
) -> RDBStorage:
    import sqlalchemy.exc

    with warnings.catch_warnings():  # the heartbeat's retry callback is experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        heartbeat = {}
        if heartbeat_interval is not None:
            heartbeat = dict(
                heartbeat_interval=int(heartbeat_interval),
                grace_period=int(grace_period or 2 * heartbeat_interval),
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(
                    _STALE_TRIAL_RETRIES
                ),
            )
        for attempt in range(_SCHEMA_ATTEMPTS):
            try:
                return RDBStorage(url, **heartbeat)
            except ImportError as error:
                driver = (
                    "psycopg[binary]" if url.startswith("postgresql") else "the database driver"
                )
                raise AutoprecError(
                    f"storage {_safe_url(url)!r}: {error.__cause__ or error}. Install {driver} "
                    "(pip install ...) in this environment, or use a journal file (search.log)."
                ) from error
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
                if attempt == _SCHEMA_ATTEMPTS - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))  # another process is creating the tables
    raise AssertionError("unreachable")


def _safe_url(url: str) -> str:
    """Returns a database URL with its password left out, for messages."""
    scheme, separator, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not separator or not at:
        return url
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


def claim_study_lock(study: optuna.Study, what: str) -> str | None:
    """Takes a lock shared by a study's processes: creates the study `"<name>:autoprec-<what>"`."""
    name = f"{study.study_name}:autoprec-{what}"
    try:
        study._storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], name)
    except optuna.exceptions.DuplicatedStudyError:
        return None
    return name


def release_study_lock(study: optuna.Study, name: str) -> None:
    """Releases a lock taken by `claim_study_lock` (deletes its study)."""
    storage = study._storage
    try:
        storage.delete_study(storage.get_study_id_from_name(name))
    except KeyError:
        pass


#: Seconds between two looks at the storage while another trial evaluates the same assignment.
_POLL_SECONDS = 0.5
#: A trial waits at least this long (and 3 x the longest trial) for another one evaluating
#: its assignment, then evaluates it too (the other's process may have died unseen).
_MIN_WAIT_SECONDS = 120.0


def _same_plan(
    study: optuna.Study, key: str, train_steps: int, state: optuna.trial.TrialState
) -> Iterator[tuple[optuna.trial.FrozenTrial, TrialRecord]]:
    """The trials in `state` evaluating the assignment `key` at `train_steps`, with their records."""
    for other in study.get_trials(deepcopy=False, states=(state,)):
        record = TrialRecord.from_trial(other)
        if record.assignment_key == key and record.train_steps == train_steps:
            yield other, record


def trained_outcome(study: optuna.Study, key: str, train_steps: int) -> TrialRecord | None:
    """Returns what a completed trial trained itself for the same assignment, as a reuse records it."""
    for other, record in _same_plan(study, key, train_steps, optuna.trial.TrialState.COMPLETE):
        if record.trained_here:
            metrics = {
                key: math.nan if v is None else float(v) for key, v in record.metrics.items()
            }
            return dataclasses.replace(record, metrics=metrics, reused_from=other.number)
    return None


def wait_for_same_assignment(
    study: optuna.Study,
    trial_number: int,
    key: str,
    train_steps: int,
    *,
    timeout: float | None = None,
) -> TrialRecord | None:
    """Waits while another running trial evaluates the same assignment; returns its outcome."""
    deadline, waiting = None, f"autoprec.search: trial {trial_number} "
    while True:
        stored = trained_outcome(study, key, train_steps)
        if stored is not None:
            return stored
        others = [  # the running trials this one waits for
            other.number
            for other, record in _same_plan(
                study, key, train_steps, optuna.trial.TrialState.RUNNING
            )
            if other.number != trial_number
            and (record.evaluating == other.number or other.number < trial_number)
        ]
        if not others:
            return None
        if deadline is None:
            durations = [
                trial.duration.total_seconds()
                for trial in study.get_trials(deepcopy=False, states=_COMPLETE)
                if trial.duration is not None
            ]
            longest = max(_MIN_WAIT_SECONDS, 3.0 * max(durations, default=0.0))
            deadline = time.monotonic() + (timeout if timeout is not None else longest)
            logger.info(f"{waiting}waits for trial {others[0]}, which evaluates the same plan.")
        elif time.monotonic() > deadline:
            logger.info(f"{waiting}stops waiting for trial {others[0]} and evaluates the plan.")
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        time.sleep(_POLL_SECONDS)


#: Steps reported to the pruner: after the cost prediction, after the numerical proxy.
COST_STEP, PROXY_STEP = 0, 1


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


def feasible_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Returns the completed trials within budget, cheapest first (lowest number among equals)."""
    completed = study.get_trials(deepcopy=False, states=_COMPLETE)
    feasible = [trial for trial in completed if is_feasible(trial) and trial.value is not None]
    return sorted(feasible, key=lambda trial: (trial.value, trial.number))


def best_feasible(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """Returns the cheapest completed trial within budget (lowest number among equals)."""
    return next(iter(feasible_trials(study)), None)


def open_study(context: SearchContext) -> tuple[optuna.Study, bool]:
    """Returns `(study, created)`: the study given, else created or loaded (TPE, `FidelityPruner`)."""
    if context.study is not None:
        return context.study, not context.study.trials
    sampler, pruner = context.sampler, context.pruner
    if sampler is None:
        sampler = optuna.samplers.TPESampler(
            seed=context.settings.seed, n_startup_trials=6, multivariate=False
        )
    if pruner is None:
        pruner = FidelityPruner(context.settings.proxy_tolerance)
    storage, study_name = resolve_storage(context.storage), context.study_name
    arguments = dict(
        storage=storage, study_name=study_name, sampler=sampler, pruner=pruner, direction="minimize"
    )
    try:
        return optuna.create_study(load_if_exists=False, **arguments), True
    except optuna.exceptions.DuplicatedStudyError:
        return optuna.load_study(
            study_name=study_name, storage=storage, sampler=sampler, pruner=pruner
        ), False


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
    """Returns `{label: {trial, state, metric, within_budget, predicted_seconds}}`."""
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
    """Returns `{"trials", "complete", "pruned", "failed", "reused"}` of the study."""
    trials = study.trials
    states = optuna.trial.TrialState
    return {
        "trials": len(trials),
        "complete": sum(t.state == states.COMPLETE for t in trials),
        "pruned": sum(t.state == states.PRUNED for t in trials),
        "failed": sum(t.state == states.FAIL for t in trials),
        "reused": sum(TrialRecord.from_trial(t).reused for t in trials),
    }


def log_trial(context: SearchContext, trial: optuna.trial.FrozenTrial) -> None:
    """Logs one line about a finished trial (verbose searches only)."""
    if not context.verbose:
        return
    record = TrialRecord.from_trial(trial)
    metric, seconds = record.metric, record.predicted_seconds
    verdict = {
        optuna.trial.TrialState.COMPLETE: "ok" if is_feasible(trial) else "over budget",
        optuna.trial.TrialState.PRUNED: f"pruned ({record.pruned_by or ''})",
        optuna.trial.TrialState.FAIL: "failed",
    }.get(trial.state, str(trial.state))
    metric_text = f"{metric:.6g}" if isinstance(metric, (int, float)) else "n/a"
    step = f"{seconds * 1e3:.3f} ms" if isinstance(seconds, (int, float)) else "n/a"
    step += f" (x{context.float32_seconds / seconds:.2f})" if seconds else ""
    logger.info(
        f"trial {trial.number}: {short_counts_text(record.dtype_counts or {})} | fidelity "
        f"{(record.fidelity or ('-',))[-1]} | {context.budget.metric} {metric_text} | "
        f"predicted {step} | {verdict}"
    )


def plan_writer(context: SearchContext) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """Returns the Optuna callback that logs each trial and saves the best plan so far."""
    written: dict[str, int | None] = {"number": None}
    plan_path = context.settings.plan_path

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        log_trial(context, trial)
        if plan_path is None:
            return
        while True:
            best = best_feasible(study)
            if best is None or best.number == written["number"]:
                return
            if plan_file_trial(plan_path, study.study_name) != best.number:
                context.trial_plan(best, metadata=trial_plan_metadata(context, best)).save(
                    plan_path
                )
                logger.info(
                    f"autoprec.search: best plan so far (trial {best.number}) written to {plan_path}"
                )
            written["number"] = best.number

    return callback


def plan_file_trial(plan_path: str | os.PathLike, study_name: str) -> int | None:
    """Returns the trial of study `study_name` whose plan the file holds, or `None`."""
    try:
        data = json.loads(Path(plan_path).read_text(encoding="utf-8"))
        search = data["metadata"]["search"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(search, dict) or search.get("study_name") != study_name:
        return None
    number = search.get("best_trial")
    return number if isinstance(number, int) else None


def trial_plan_metadata(context: SearchContext, trial: optuna.trial.FrozenTrial | None) -> dict:
    """Returns the plan metadata of a trial's plan (float32's for `None`): its metric and speedup."""
    base = {**context.metadata, "reference_metric": context.reference}
    if trial is None:
        return {**base, "measured_metric": context.reference, "predicted_speedup": 1.0}
    record = TrialRecord.from_trial(trial)
    seconds = record.predicted_seconds
    return {
        **base,
        "measured_metric": record.metric,
        "predicted_speedup": (context.float32_seconds / seconds) if seconds else None,
        "search": {**base.get("search", {}), "best_trial": trial.number},
    }


#: Weight of activation memory in the objective: a tie-break between equally fast plans.
_MEMORY_TIE_BREAK = 1e-3
#: The levels a trial reaches when it trains with the proxy, or reuses another trial's training.
_TRAINED_LEVELS = ("profile", "proxy", "train")


def trial_objective(context: SearchContext, trial: optuna.Trial) -> float:
    """Returns a trial's predicted cost after judging its plan; prunes or constrains it."""
    for group in context.groups:
        if len(group.choices) > 1:
            trial.suggest_categorical(group.name, list(group.choices))
    assignment = context.trial_assignment(trial)  # an enqueued plan, else the suggestions
    key, predicted = assignment_key(assignment), prediction(context, assignment)
    memory = predicted["activation_bytes_per_sample"]
    float32_memory = context.costs.step(dict.fromkeys(context.compute, FLOAT32))[1]
    value = predicted["predicted_seconds"] * (
        1.0 + _MEMORY_TIE_BREAK * memory / max(float32_memory, 1.0)
    )
    fidelity = ("profile",)
    write_record(
        trial,
        TrialRecord(assignment=assignment, assignment_key=key, fidelity=fidelity, **predicted),
    )
    floor = context.output_floor(assignment)
    if floor is not None:
        trial.set_user_attr("output_floor", floor.to_dict())
        trial.set_constraint("output_floor", floor.violation)
        if floor.refused:
            refused = TrialRecord(fidelity=("profile", "floor"), budget_violation=floor.violation)
            write_record(trial, refused)
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


def _train_trial(
    context: SearchContext, trial: optuna.Trial, assignment: dict[str, str], key: str, value: float
) -> float:
    """Runs the proxy (TensorFlow, may prune) and the short training; records the outcome."""
    plan, proxy = context.plan_for(assignment), None
    if keras.backend.backend() == "tensorflow":
        proxy = context.evaluator.proxy(plan)
        write_record(
            trial,
            TrialRecord(
                fidelity=("profile", "proxy"),
                proxy=proxy.to_dict(),
                proxy_score=json_safe(proxy.score),
            ),
            with_none=("proxy_score",),
        )
        trial.report(value, PROXY_STEP)
        if trial.should_prune():
            write_record(trial, TrialRecord(pruned_by="proxy: loss/gradients too far from float32"))
            trial.set_constraint("budget", HUGE_VIOLATION if not proxy.finite else 1.0)
            raise optuna.TrialPruned()
    else:
        skipped = "the numerical proxy needs the TensorFlow backend"
        write_record(trial, TrialRecord(proxy_skipped=skipped))
    metrics = context.evaluator.train_and_evaluate(plan)
    context.cache[key] = TrialRecord(
        metrics=metrics,
        proxy=proxy.to_dict() if proxy is not None else None,
        proxy_score=proxy.score if proxy is not None else None,
        reused_from=trial.number,
    )
    levels = _TRAINED_LEVELS if proxy is not None else ("profile", "train")
    return _record_outcome(context, trial, metrics, value, levels)


def _reuse(
    context: SearchContext, trial: optuna.Trial, outcome: TrialRecord, value: float
) -> float:
    """Records a stored outcome of the same assignment instead of training it again."""
    write_record(
        trial,
        TrialRecord(
            reused=True,
            reused_from=outcome.reused_from,
            proxy=outcome.proxy,
            proxy_score=json_safe(outcome.proxy_score),
        ),
        with_none=("proxy", "proxy_score"),
    )
    return _record_outcome(context, trial, outcome.metrics, value, _TRAINED_LEVELS)


def _record_outcome(
    context: SearchContext,
    trial: optuna.Trial,
    metrics: Mapping[str, float],
    value: float,
    levels: tuple[str, ...] | list[str],
) -> float:
    record = judged_record(context, metrics, levels)
    write_record(trial, record, with_none=("metric",))
    trial.set_constraint("budget", record.budget_violation)
    return value


def judged_record(
    context: SearchContext, metrics: Mapping[str, float], levels: Sequence[str], **fields: Any
) -> TrialRecord:
    """Returns the record of trained metrics (levels reached, metric, violation) and `fields`."""
    metric = metrics.get(context.budget.log_name)
    return TrialRecord(
        fidelity=tuple(levels),
        metrics={name: json_safe(value) for name, value in metrics.items()},
        metric=json_safe(metric),
        budget_violation=context.budget.violation(context.reference, metric),
        **fields,
    )


def prediction(context: SearchContext, compute: Mapping[str, str]) -> dict[str, Any]:
    """Returns the record fields of an assignment's predicted cost, at the search's fidelity."""
    seconds, activation_bytes = context.costs.step(dict(compute))
    return dict(
        train_steps=context.train_steps,
        dtype_counts=count_dtypes(compute.values()),
        predicted_seconds=seconds,
        activation_bytes_per_sample=activation_bytes,
    )


def optimize(
    context: SearchContext,
    n_trials: int | None,
    *,
    timeout: float | None = None,
    explorer: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] | None = None,
) -> None:
    """Runs trials of the study with the objective, the plan writer and the user's callbacks."""
    settings = context.settings
    context.study.optimize(
        lambda trial: trial_objective(context, trial),
        n_trials=n_trials,
        timeout=timeout,
        catch=tuple(settings.catch),
        callbacks=[plan_writer(context), *([explorer] if explorer else []), *settings.callbacks],
        show_progress_bar=explorer is not None and context.verbose >= 1,
    )


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
        hardware=context.hardware_profile or context.hardware,
        dtypes=context.dtypes,
        keep_float32=context.settings.keep_float32,
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
