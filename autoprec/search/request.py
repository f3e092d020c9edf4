"""`SearchRequest`: what one `search()` call asked for, resolved, and the clock of its stages."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator
from typing import Any

import optuna

from ..hardware import HardwareProfile
from .budget import Budget
from .settings import SearchSettings


class StageClock:
    """Seconds spent in each stage of one search, added up as the search goes.

    Example:

    ```python
    clock = StageClock()
    with clock.stage("trials"):
        study.optimize(objective, n_trials=5)
    clock.seconds["trials"]
    ```
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Adds the seconds spent inside the block to `seconds[name]`."""
        started = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - started
            self.seconds[name] = self.seconds.get(name, 0.0) + spent


@dataclasses.dataclass(frozen=True)
class SearchRequest:
    """What one `search()` call asked for beyond the model and data: its arguments, resolved.

    Attributes:
        budget: the `Budget`.
        hardware: `search`'s `hardware=`.
        n_trials: trials to run in this call.
        timeout: seconds before no new trial starts.
        storage: `search`'s `storage=`.
        study_name: the study's name.
        study: a study given instead of `storage`, or `None`.
        sampler: an Optuna sampler, or `None`.
        pruner: an Optuna pruner, or `None`.
        settings: the `SearchSettings`.
        verbose: the verbosity.
        started: `time.perf_counter()` when the call started.
        train_data: `search`'s `x`, to take longer training from.
        max_train_steps: how far the reference check may lengthen training.
        clock: the seconds spent in each stage.
    """

    budget: Budget
    hardware: HardwareProfile | str
    n_trials: int | None
    timeout: float | None
    storage: str | os.PathLike | optuna.storages.BaseStorage | None
    study_name: str | None
    study: optuna.Study | None
    sampler: optuna.samplers.BaseSampler | None
    pruner: optuna.pruners.BasePruner | None
    settings: SearchSettings
    verbose: int
    started: float
    train_data: Any
    max_train_steps: int
    clock: StageClock = dataclasses.field(default_factory=StageClock)
