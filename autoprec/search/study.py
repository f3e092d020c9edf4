"""Optuna plumbing of the search: storage, study creation and resume, trials, constraints.

A trial proposes one dtype per group (sampled by TPE), or carries a whole per-layer
assignment in its user attrs (warm starts and neighbours of the best plan, enqueued
as fixed-params trials), and runs the plan at rising fidelity: its predicted cost
(pruned when no faster than the best plan within budget), the numerical proxy
(pruned when hopeless), then short training, whose budget violation is the trial's
constraint (`trial.set_constraint`, read by the seeded `TPESampler`). Every trial
records its effective per-layer assignment (`"assignment"`, `"assignment_key"`); an
assignment already trained at the same fidelity is reused, never trained twice.

Several processes, on one machine or many, may search one study through a shared
storage (a journal file, PostgreSQL): the warm starts are enqueued once, under a
lock that is a uniquely named study (creating a study is atomic in every Optuna
storage); a trial whose assignment another running trial is evaluating waits for it
and reuses its outcome; database storages record a heartbeat, so that a trial of a
process that died is failed and enqueued again by the next process that starts one;
the best plan so far is written atomically and written again whenever another
process overwrote it with an older best.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import keras
import optuna
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend

from .._core.dtypes import FLOAT32, count_dtypes, widen
from ..errors import AutoprecError
from ..layers import LayerInfo
from ..plan import PrecisionPlan
from .budget import HUGE_VIOLATION, Budget
from .evaluator import Evaluator
from .heuristic import PlanCosts
from .result import ParetoPoint, short_counts_text
from .space import Group, plan_from_assignment

logger = logging.getLogger("autoprec")

#: Weight of activation memory in the objective: a tie-break between equally fast plans.
_MEMORY_TIE_BREAK = 1e-3
#: Steps reported to the pruner: after the cost prediction, after the numerical proxy.
_COST_STEP, _PROXY_STEP = 0, 1


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
    """Returns the Optuna storage for a `storage=` argument: journal files and database URLs opened.

    A database URL (`"postgresql://..."`, `"mysql://..."`, `"sqlite:///..."`) opens an
    `RDBStorage` whose running trials record a heartbeat every `heartbeat_interval`
    seconds: a trial whose process died (no heartbeat for `grace_period` seconds) is
    marked failed by the next process that starts a trial, and enqueued again
    (`RetryHeartbeatStaleTrialCallback`, twice at most). Processes that open the same
    new database at once may race to create its tables; that is retried.

    Args:
        storage: a database URL, a journal file (`"journal:///path/file.log"` or any
            path ending `.log`), a storage object (returned as is), or `None` (in memory).
        heartbeat_interval: seconds between heartbeats of a database storage's running
            trials; `None` records none (a dead process's trial then stays running).
        grace_period: seconds without a heartbeat after which a trial is stale;
            default twice `heartbeat_interval`.

    Returns:
        A `JournalStorage`, an `RDBStorage`, the storage object given, or `None`.

    Raises:
        AutoprecError: the database driver of the URL is not installed (the message
            names the package to install).

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
        return _database_storage(text, heartbeat_interval, grace_period)
    return JournalStorage(JournalFileBackend(text))


def _database_storage(
    url: str, heartbeat_interval: int | None, grace_period: int | None
) -> RDBStorage:
    import sqlalchemy.exc

    for attempt in range(_SCHEMA_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                if heartbeat_interval is None:
                    return RDBStorage(url)
                return RDBStorage(
                    url,
                    heartbeat_interval=int(heartbeat_interval),
                    grace_period=int(grace_period or 2 * heartbeat_interval),
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(
                        max_retry=_STALE_TRIAL_RETRIES
                    ),
                )
        except ImportError as error:
            driver = "psycopg[binary]" if url.startswith("postgresql") else "the database driver"
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
            best = best_feasible(study)
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
                (passed if is_feasible(other) else failed).append(other_score)
            worst_pass = max(passed, default=-math.inf)
            best_fail = min(failed, default=math.inf)
            return score >= best_fail and score > worst_pass
        return False


def is_feasible(trial: optuna.trial.FrozenTrial) -> bool:
    constraints = trial.constraints
    return bool(constraints) and all(value <= 0 for value in constraints.values())


def best_feasible(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    feasible = [
        trial
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if is_feasible(trial) and trial.value is not None
    ]
    return min(feasible, key=lambda trial: (trial.value, trial.number), default=None)


def open_study(
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


#: The study user attr set once the warm starts are in the study.
WARM_STARTS_MARK = "warm_starts_enqueued"
#: Seconds between two looks at the storage while another trial evaluates the same assignment.
_SAME_ASSIGNMENT_POLL_SECONDS = 0.5
#: A trial waits at least this long (and 3 x the longest trial) for another one evaluating
#: its assignment, then evaluates it too (the other's process may have died unseen).
_SAME_ASSIGNMENT_MIN_WAIT_SECONDS = 120.0
#: User attr a trial sets to its own number once it evaluates its assignment itself.
_EVALUATING = "evaluating"


def assignment_key(assignment: Mapping[str, str]) -> str:
    """Returns a short stable digest of a per-layer assignment (equal assignments, equal keys)."""
    text = json.dumps(sorted(assignment.items()), separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def _has_warm_starts(study: optuna.Study) -> bool:
    return bool(study.user_attrs.get(WARM_STARTS_MARK))


def claim_study_lock(study: optuna.Study, what: str) -> str | None:
    """Takes a lock shared by every process of a study: creates the study `"<name>:autoprec-<what>"`.

    Creating a study is atomic in every Optuna storage (a unique name in a database,
    the first record of a journal), so exactly one of the processes that try at once
    gets the lock. `release_study_lock` deletes it; a process killed while holding it
    leaves it held.

    Args:
        study: the study whose processes share the lock (its storage holds it).
        what: what the lock guards, part of its name.

    Returns:
        The lock's name when this process got it, else `None`.

    Example:

    ```python
    lock = claim_study_lock(study, "warm-starts")
    if lock is not None:
        try:
            ...  # done by one process only
        finally:
            release_study_lock(study, lock)
    ```
    """
    name = f"{study.study_name}:autoprec-{what}"
    try:
        study._storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], name)
    except optuna.exceptions.DuplicatedStudyError:
        return None
    return name


def release_study_lock(study: optuna.Study, name: str) -> None:
    """Releases a lock taken by `claim_study_lock` (deletes its study).

    Args:
        study: the study whose processes share the lock.
        name: the lock's name, as `claim_study_lock` returned it.
    """
    storage = study._storage
    try:
        storage.delete_study(storage.get_study_id_from_name(name))
    except KeyError:
        pass


def enqueue_warm_starts(
    study: optuna.Study,
    warm: Sequence[tuple[str, Mapping[str, str], Mapping[str, str]]],
    created: bool,
) -> int:
    """Enqueues `(label, assignment, params)` warm starts not already in the study; returns how many.

    Exactly one process enqueues them, whichever process takes the study's
    `"warm-starts"` lock (`claim_study_lock`) first, whether it created the study or
    not; it then marks the study (`WARM_STARTS_MARK`) and releases the lock. A
    process that finds the mark, or the lock taken, enqueues none and does not wait:
    its trials start with what the queue holds. `created` is not needed for this
    (kept for callers).
    """
    del created
    if _has_warm_starts(study):
        return 0
    lock = claim_study_lock(study, "warm-starts")
    if lock is None:
        return 0
    try:
        if _has_warm_starts(study):  # another process finished and released the lock meanwhile
            return 0
        added = _enqueue_missing(study, warm)
        study.set_user_attr(WARM_STARTS_MARK, True)
        return added
    finally:
        release_study_lock(study, lock)


def _enqueue_missing(
    study: optuna.Study, warm: Sequence[tuple[str, Mapping[str, str], Mapping[str, str]]]
) -> int:
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
        key = assignment_key(assignment)
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
    return added


def wait_for_same_assignment(
    study: optuna.Study,
    trial_number: int,
    key: str,
    train_steps: int,
    *,
    timeout: float | None = None,
) -> dict[str, Any] | None:
    """Waits while another running trial evaluates the same assignment; returns its outcome.

    Trials of several processes may carry one assignment (two processes enqueued the
    same neighbour, or TPE sampled what another process runs). A trial waits for
    another running trial with the same `key` and `train_steps` that evaluates it
    (its `"evaluating"` user attr set) or that has a lower number, so that no two wait
    for each other; the waiting trial then reuses that trial's outcome. While it
    waits, trials of dead processes are failed (`optuna.storages.fail_stale_trials`,
    database storages with a heartbeat).

    Args:
        study: the study.
        trial_number: the waiting trial's number.
        key: the assignment's key (`"assignment_key"` user attr).
        train_steps: the fidelity it is evaluated at (`"train_steps"` user attr).
        timeout: seconds to wait at most; default the longer of 120 s and 3 x the
            longest completed trial.

    Returns:
        The outcome (`{"metrics", "proxy", "proxy_score", "trial"}`) of a completed trial
        that trained the assignment, or `None` when this trial is to evaluate it.

    Example:

    ```python
    outcome = wait_for_same_assignment(trial.study, trial.number, key, train_steps=20)
    ```
    """
    deadline = None
    while True:
        stored = _stored_outcome(study, key, train_steps)
        if stored is not None:
            return stored
        others = [
            other
            for other in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
            if other.number != trial_number
            and other.user_attrs.get("assignment_key") == key
            and other.user_attrs.get("train_steps") == train_steps
            and (other.user_attrs.get(_EVALUATING) == other.number or other.number < trial_number)
        ]
        if not others:
            return None
        if deadline is None:
            limit = timeout if timeout is not None else _same_assignment_wait(study)
            deadline = time.monotonic() + limit
            logger.info(
                "autoprec.search: trial %d waits for trial %d, which evaluates the same plan.",
                trial_number,
                others[0].number,
            )
        elif time.monotonic() > deadline:
            logger.info(
                "autoprec.search: trial %d stops waiting for trial %d and evaluates the plan.",
                trial_number,
                others[0].number,
            )
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        time.sleep(_SAME_ASSIGNMENT_POLL_SECONDS)


def _same_assignment_wait(study: optuna.Study) -> float:
    durations = [
        trial.duration.total_seconds()
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if trial.duration is not None
    ]
    return max(_SAME_ASSIGNMENT_MIN_WAIT_SECONDS, 3.0 * max(durations, default=0.0))


@dataclasses.dataclass
class SearchContext:
    """Everything a trial needs, built once per `search()` call."""

    model: keras.Model
    infos: Mapping[str, LayerInfo]
    compute: list[str]
    groups: list[Group]
    allowed: dict[str, tuple[str, ...]]
    evaluator: Evaluator
    costs: PlanCosts
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
        return plan_from_assignment(self.model, self.infos, self.normalise(assignment), **kwargs)

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


def trial_objective(context: SearchContext, trial: optuna.Trial) -> float:
    params = {
        group.name: trial.suggest_categorical(group.name, list(group.choices))
        for group in context.groups
        if len(group.choices) > 1
    }
    fixed = trial.user_attrs.get("assignment")
    assignment = context.normalise(fixed) if fixed else context.assignment(params)
    key = assignment_key(assignment)
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
    stored = context.cache.get(key) or wait_for_same_assignment(
        trial.study, trial.number, key, context.train_steps
    )
    if stored is not None:
        return _reuse(context, trial, stored, value)
    trial.set_user_attr(_EVALUATING, trial.number)
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
            trial.set_constraint("budget", HUGE_VIOLATION if not proxy.finite else 1.0)
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


def _max_activation(context: SearchContext) -> float:
    _, float32_bytes = context.costs.step({path: FLOAT32 for path in context.compute})
    return max(float32_bytes, 1.0)


def _reuse(context: SearchContext, trial: optuna.Trial, outcome: dict, value: float) -> float:
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
    context: SearchContext, trial: optuna.Trial, outcome: dict, value: float, levels: list[str]
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


def _log_trial(
    context: SearchContext, study: optuna.Study, trial: optuna.trial.FrozenTrial
) -> None:
    if not context.verbose:
        return
    attrs = trial.user_attrs
    counts = attrs.get("dtype_counts") or {}
    fidelity = (attrs.get("fidelity") or ["-"])[-1]
    metric = attrs.get("metric")
    seconds = attrs.get("predicted_seconds")
    verdict = {
        optuna.trial.TrialState.COMPLETE: "ok" if is_feasible(trial) else "over budget",
        optuna.trial.TrialState.PRUNED: f"pruned ({attrs.get('pruned_by', '')})",
        optuna.trial.TrialState.FAIL: "failed",
    }.get(trial.state, str(trial.state))
    logger.info(
        "trial %d: %s | fidelity %s | %s %s | predicted %s%s | %s",
        trial.number,
        short_counts_text(counts),
        fidelity,
        context.budget.metric,
        f"{metric:.6g}" if isinstance(metric, (int, float)) else "n/a",
        f"{seconds * 1e3:.3f} ms" if isinstance(seconds, (int, float)) else "n/a",
        f" (x{context.float32_seconds / seconds:.2f})" if seconds else "",
        verdict,
    )


def plan_writer(
    context: SearchContext, plan_path: str | os.PathLike | None, metadata: dict
) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """Returns the Optuna callback that logs each trial and saves the best plan so far.

    Every process of a study writes the study's best feasible trial (atomically) when
    the file does not hold it already, then looks at the study again: when a better
    trial finished meanwhile, its process may have written before this one wrote an
    older best, so it writes again. The last write of any process is the best trial
    its last look found, so the file never stays behind the study.
    """
    written: dict[str, int | None] = {"number": None}

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        _log_trial(context, study, trial)
        if plan_path is None:
            return
        while True:
            best = best_feasible(study)
            if best is None or best.number == written["number"]:
                return
            if plan_file_trial(plan_path, study.study_name) != best.number:
                plan = context.trial_plan(
                    best, metadata=trial_plan_metadata(context, best, metadata)
                )
                plan.save(plan_path)
                logger.info(
                    "autoprec.search: best plan so far (trial %d) written to %s",
                    best.number,
                    plan_path,
                )
            written["number"] = best.number

    return callback


def plan_file_trial(plan_path: str | os.PathLike, study_name: str) -> int | None:
    """Returns the trial of study `study_name` whose plan the file holds, or `None`.

    Args:
        plan_path: a plan file written by the search (metadata `search.study_name`
            and `search.best_trial`).
        study_name: the study it should come from.

    Returns:
        The trial number, or `None` when the file is missing, unreadable, or from
        another study.

    Example:

    ```python
    assert plan_file_trial("plan.json", "mlp") == study.best_trial.number
    ```
    """
    try:
        data = json.loads(Path(plan_path).read_text(encoding="utf-8"))
        search = data["metadata"]["search"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(search, dict) or search.get("study_name") != study_name:
        return None
    number = search.get("best_trial")
    return number if isinstance(number, int) else None


def trial_plan_metadata(
    context: SearchContext, trial: optuna.trial.FrozenTrial, base: dict
) -> dict:
    seconds = trial.user_attrs.get("predicted_seconds")
    return {
        **base,
        "reference_metric": context.reference,
        "measured_metric": trial.user_attrs.get("metric"),
        "predicted_speedup": (context.float32_seconds / seconds) if seconds else None,
        "search": {**base.get("search", {}), "best_trial": trial.number},
    }


def pareto_points(context: SearchContext, study: optuna.Study) -> list[ParetoPoint]:
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
                feasible=is_feasible(trial),
                counts=dict(trial.user_attrs.get("dtype_counts") or {}),
                label=trial.user_attrs.get("warm_start"),
            )
        )
    return points
