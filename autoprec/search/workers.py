"""`search_in_processes`: one study searched by N local processes on a shared Optuna storage."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from collections.abc import Mapping
from typing import Any

import keras

from ..errors import AutoprecError
from .budget import Budget
from .driver import search
from .result import SearchResult
from .settings import SearchSettings


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
