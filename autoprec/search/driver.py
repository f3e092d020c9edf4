"""`search()` and `search_in_processes()`: the search's stages in order, in one process or several."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
from collections.abc import Mapping
from typing import Any

import keras
import optuna

from .._core.data import take_batches
from ..errors import AutoprecError, BackendError
from ..hardware import HardwareProfile
from ..runtime.guard import GUARD_BACKENDS
from .budget import Budget
from .evaluator import Evaluator
from .preparation import prepare, run_trials
from .result import SearchResult
from .selection import add_finalists, build_result, choose_plan, rank_trials
from .settings import SearchRequest, SearchSettings


def search(
    model: keras.Model,
    x: Any,
    validation_data: Any,
    *,
    budget: Budget,
    hardware: HardwareProfile | str = "local",
    n_trials: int | None = 20,
    timeout: float | None = None,
    storage: str | os.PathLike | optuna.storages.BaseStorage | None = None,
    study_name: str | None = None,
    study: optuna.Study | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
    settings: SearchSettings | None = None,
    verbose: int = 1,
) -> SearchResult:
    """Searches the cheapest dtype per layer whose short-training metric stays within `budget`.

    The user's model is left unchanged: trials run on a clone
    (`keras.models.clone_model`, same weights, recompiled with a fresh copy of the
    optimizer from its config and the same loss and metrics). Subclassed models
    need `get_config` to be cloned; without it the search works on the model itself
    and puts back its weights and policies at the end (its optimizer is never used).
    Every uniform plan and the heuristic's per-layer plan are evaluated first; after
    the trials, Keras' own global policies (every layer, containers included) and the
    best plan with each default float32 protection dropped where the profile allows
    it are evaluated too. The returned plan costs no more than any of them that held
    the budget, and where steps are timed here it is the fastest of them beyond the
    measured noise (a tie goes to the simpler plan).

    Args:
        model: a built, compiled Keras model.
        x: the training data, as `model.fit` takes it in one argument: an `(x, y)` or
            `(x, y, sample_weight)` tuple of arrays, a `tf.data.Dataset`, a
            `keras.utils.PyDataset` or a generator of such batches. Every trial trains
            on its first `settings.steps_per_trial` batches, in order.
        validation_data: the same kinds; the budget metric is evaluated on it.
        budget: an `autoprec.Budget`.
        hardware: `"local"` (this device: layer costs measured here with
            `autoprec.calibrate`), a hardware profile name such as `"rtx4090"` or a
            `HardwareProfile` (costs predicted for that device).
        n_trials: trials to run in this call (added to those already in the study);
            `None` runs until `timeout`.
        timeout: stop starting trials after this many seconds.
        storage: any Optuna storage: a URL (`"sqlite:///autoprec.db"`,
            `"postgresql://..."`), a journal file (`"journal:///path/file.log"` or a path
            ending `.log`), or a storage object. The same storage and `study_name`
            resume the study; several processes, on one machine or many, may share one.
        study_name: the study's name (needed to resume or share a study).
        study: an `optuna.Study` to search in instead of `storage` and `study_name`
            (created with `direction="minimize"`); its sampler and pruner are used.
        sampler: an Optuna sampler; default a seeded `optuna.samplers.TPESampler`.
        pruner: an Optuna pruner; default one that prunes plans whose numerical proxy
            misses `settings.proxy_tolerance` before they are trained.
        settings: an `autoprec.SearchSettings` with the rarer knobs (batch size, steps
            per trial, dtypes, grouping, a profile or cost table to reuse, plan path,
            Optuna callbacks); default `SearchSettings()`.
        verbose: 0 silent, 1 (default) a progress bar over trials and one log line per
            stage (logger `"autoprec"`), 2 also one line per trial and the calibration
            progress.

    Returns:
        A `SearchResult`.

    The body is short: it checks the arguments and runs the stages of `run_search`
    (this docstring is what makes the function long).

    Raises:
        BackendError: on a Keras backend other than TensorFlow or JAX (trials train
            with the guard, whose in-step telemetry runs there).
        AutoprecError: the budget metric is not reported by the model (the message
            lists those that are), the model is not compiled, or the float32
            reference has not learned at the search's fidelity (the message names the
            metric, its value, the baseline and what to change).

    Example:

    ```python
    result = autoprec.search(model, (x, y), (x_val, y_val),
                             budget=autoprec.Budget("val_accuracy", max_drop=0.01),
                             n_trials=20, storage="sqlite:///autoprec.db", study_name="mlp")
    print(result.report())
    result.plan.save("plan.json")
    ```
    """
    started = time.perf_counter()
    backend = keras.backend.backend()
    if backend not in GUARD_BACKENDS:
        raise BackendError(
            f"autoprec.search runs on Keras' TensorFlow and JAX backends (its trials train "
            f"with the guard and time costs there); this Keras runs {backend!r}. Set "
            "KERAS_BACKEND=tensorflow or jax before importing keras, or predict a plan "
            "without training with autoprec.heuristic_plan(model, hardware=...)."
        )
    settings = _checked_settings(budget, settings)
    _check_study(study, storage, study_name, sampler, pruner)
    train_batches = take_batches(
        x, settings.batch_size, settings.steps_per_trial,
        what="search: x", error_class=AutoprecError,
    )  # fmt: skip
    val_batches = take_batches(
        validation_data, settings.batch_size, settings.validation_steps,
        what="search: validation_data", error_class=AutoprecError,
    )  # fmt: skip
    request = SearchRequest(
        budget=budget, hardware=hardware, n_trials=n_trials, timeout=timeout, storage=storage,
        study_name=study_name, study=study, sampler=sampler, pruner=pruner, settings=settings,
        verbose=verbose, started=started, train_data=x,
        max_train_steps=settings.max_steps_per_trial or 8 * len(train_batches),
    )  # fmt: skip
    seed = 0 if settings.seed is None else int(settings.seed)
    evaluator = Evaluator(model, train_batches, val_batches, settings.proxy_batches, seed)
    try:
        check_metric(evaluator, budget)
        return run_search(model, evaluator, request)
    finally:
        evaluator.close()


def run_search(model: keras.Model, evaluator: Evaluator, request: SearchRequest) -> SearchResult:
    """Runs the search's stages in order; each returns the value the next ones read."""
    context = prepare(model, evaluator, request)
    run_trials(context)
    with request.clock.stage("finalists"):
        finalists = add_finalists(context)
    ranking = rank_trials(context)
    return build_result(context, choose_plan(context, ranking), ranking, finalists)


def _checked_settings(budget: Budget, settings: SearchSettings | None) -> SearchSettings:
    """Returns the settings (default `SearchSettings()`) once `budget` and they are the right types."""
    if not isinstance(budget, Budget):
        raise AutoprecError(
            f"search: budget must be an autoprec.Budget, got {type(budget).__name__}."
        )
    settings = SearchSettings() if settings is None else settings
    if not isinstance(settings, SearchSettings):
        raise AutoprecError(
            f"search: settings must be an autoprec.SearchSettings, got {type(settings).__name__}."
        )
    return settings


def _check_study(
    study: optuna.Study | None,
    storage: object,
    study_name: str | None,
    sampler: optuna.samplers.BaseSampler | None,
    pruner: optuna.pruners.BasePruner | None,
) -> None:
    """Refuses a `study=` given with what it already has, or one that does not minimise."""
    if study is None:
        return
    if storage is not None or study_name is not None:
        raise AutoprecError(
            "search: pass either study= or storage=/study_name=, not both (a study already "
            "has its storage and name)."
        )
    if sampler is not None or pruner is not None:
        raise AutoprecError(
            "search: study= brings its own sampler and pruner; pass them to "
            "optuna.create_study instead of to search."
        )
    if len(study.directions) != 1 or study.direction != optuna.study.StudyDirection.MINIMIZE:
        raise AutoprecError(
            f"search: study {study.study_name!r} must have one objective, minimised (it holds "
            "the predicted step time); create it with optuna.create_study(direction='minimize')."
        )


def check_metric(evaluator: Evaluator, budget: Budget) -> None:
    """Refuses a budget metric the model does not report, listing those it does."""
    names = evaluator.metric_names()
    if budget.log_name not in names:
        available = ", ".join(f"val_{name}" for name in names)
        raise AutoprecError(
            f"Budget metric {budget.metric!r} is not reported by the model; it reports "
            f"{available} on validation data. Add the metric in model.compile(metrics=[...]) "
            "or pick one of these."
        )


def _worker(arguments: Mapping[str, Any], index: int) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    keywords = dict(arguments)
    settings = keywords.get("settings") or SearchSettings()
    keywords["settings"] = dataclasses.replace(settings, seed=int(settings.seed or 0) + index)
    search(**keywords)


def search_in_processes(
    workers: int,
    model: keras.Model,
    x: Any,
    validation_data: Any,
    *,
    budget: Budget,
    storage: str | os.PathLike,
    study_name: str,
    n_trials: int = 20,
    **search_arguments: Any,
) -> SearchResult:
    """Searches one study with `workers` local processes, each running `n_trials` trials.

    Args:
        workers: how many processes search at once.
        model: a built, compiled Keras model (pickled to each worker).
        x: `(x, y)` arrays or other picklable data, as for `search`.
        validation_data: the same kinds.
        budget: a `Budget`.
        storage: a storage several processes can share: a journal file (a path ending
            `.log`), or a database URL (`postgresql://...`, whose trials record a
            heartbeat so that those of a dead worker are retried; an SQLite file works
            for a few processes on one machine).
        study_name: the study's name.
        n_trials: trials per worker.
        **search_arguments: any other `search` argument (`hardware`, `settings`...);
            worker `i` searches with seed `settings.seed + i`.

    Returns:
        The `SearchResult` of the whole study, gathered in this process after the
        workers have finished (no new trials).

    Raises:
        AutoprecError: `workers` is below 1, or a worker exited with an error.

    Example:

    ```python
    result = search_in_processes(4, model, (x, y), (x_val, y_val),
                                 budget=autoprec.Budget("val_accuracy", max_drop=0.01),
                                 storage="search.log", study_name="mlp", n_trials=5)
    result.plan.save("plan.json")
    ```
    """
    if workers < 1:
        raise AutoprecError(f"search_in_processes: workers must be at least 1, got {workers}.")
    arguments = {
        **search_arguments,
        "model": model,
        "x": x,
        "validation_data": validation_data,
        "budget": budget,
        "storage": os.fspath(storage),
        "study_name": study_name,
        "n_trials": n_trials,
    }
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_worker, args=(arguments, index), name=f"autoprec-search-{index}")
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    failed = [(p.name, p.exitcode) for p in processes if p.exitcode != 0]
    if failed:
        raise AutoprecError(
            "search_in_processes: worker(s) "
            + ", ".join(f"{name} (exit code {code})" for name, code in failed)
            + f" failed; the study {study_name!r} in {os.fspath(storage)} keeps their "
            "finished trials, rerun to resume."
        )
    final = {**arguments, "n_trials": 0}
    return search(**final)
