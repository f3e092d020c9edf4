"""What both backends' guard-telemetry hooks share: their installation and how a frame enters the
history."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .telemetry import Replace, StepRecorder

#: Length of the status: `[failed, near_range]`.
STATUS_SLOTS = 2


def cleared_status() -> np.ndarray:
    """Returns the status with no flag raised."""
    return np.zeros(STATUS_SLOTS, np.int32)


def advance_history(
    recorder: StepRecorder, frame: Any, history: Any, status: Any, xp: Any
) -> tuple[Any, Any]:
    """Returns the history with `frame` appended and the status raised by `frame`'s flags."""
    failed, near = recorder.status_flags(frame, history, xp)
    history = xp.concatenate([history[1:], frame[None]], axis=0)
    return history, xp.maximum(status, xp.stack([failed, near]))


class TelemetryHooksBase(abc.ABC):
    """The part of the telemetry's `TelemetryHooks` that is the same on every backend."""

    #: Whether bfloat16 layers are measured only in a failing step (a conditional branch).
    measures_bfloat16_lazily: bool = False

    def install_step(
        self, model: Any, recorder: StepRecorder, owners: Mapping[int, int], replace: Replace
    ) -> None:
        """Puts the backend's `step_wrappers` in place, each with `replace`."""
        for owner, name, wrapper in self.step_wrappers(model, recorder, owners):
            replace(owner, name, wrapper)

    @abc.abstractmethod
    def step_wrappers(
        self, model: Any, recorder: StepRecorder, owners: Mapping[int, int]
    ) -> list[tuple[object, str, Callable]]:
        """Returns `(owner, method name, wrapper)` for each method `install_step` replaces."""

    @abc.abstractmethod
    def watch_gradient(self, recorder: StepRecorder, trace: Any, index: int, value: Any) -> Any:
        """Returns `value` through an identity whose gradient's amax is recorded for layer `index`."""
