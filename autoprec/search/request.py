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
    """Seconds spent in each stage of one search, added up as the search goes."""

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
    """What one `search()` call asked for beyond the model and data: its arguments, resolved."""

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
