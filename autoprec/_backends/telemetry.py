"""The one interface between the guard's telemetry and a Keras backend."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

#: How the hooks replace a method for as long as the telemetry is installed:
#: `replace(owner, name, value)` (the telemetry restores it on `remove`).
Replace = Callable[[object, str, object], None]


@runtime_checkable
class StepRecorder(Protocol):
    """The backend-neutral side of the telemetry, called by a backend's step hooks."""

    def begin_step(self, data: Any) -> Any:
        """Measures the step's input batch and opens its trace in this thread; returns it."""

    def end_step(self) -> None:
        """Closes this thread's trace (after the wrapped train step returned or raised)."""

    def active_step(self) -> Any | None:
        """Returns this recorder's open trace in this thread, or `None`."""

    def record_weight_gradient(self, trace: Any, owner: int | None, gradient: Any) -> None:
        """Records one gradient the optimizer received (`owner`: the recorded layer's index)."""

    def measure(self, trace: Any, tensor: Any) -> Any:
        """Returns the amax bits (int32) of `tensor`, measured as the step measures (not kept)."""

    def gradients_finite(self, trace: Any) -> Any:
        """Returns whether every gradient recorded so far in the step is finite (a traced boolean)."""

    def record_activation_gradient(self, trace: Any, index: int, bits: Any) -> None:
        """Records the amax bits of the gradient flowing into recorded layer `index`."""

    def take_forward_values(self, trace: Any) -> tuple[Any, list[int]]:
        """Returns `(stacked amax bits, frame segments)` recorded so far, and forgets them."""

    def frame(self, trace: Any, scale: Any, extra: tuple[Any, list[int]] | None = None) -> Any:
        """Returns the step's frame (float32, one row per recorded layer below a header row)."""

    def status_flags(self, frame: Any, history: Any, xp: Any) -> tuple[Any, Any]:
        """Returns `(failed, near_range)` of a frame after `history`, with `xp` (NumPy or ops)."""


@runtime_checkable
class TelemetryHooks(Protocol):
    """What each backend module's `TelemetryHooks(history)` provides to the telemetry."""

    #: Whether bfloat16 layers are measured only in a failing step (a conditional branch).
    measures_bfloat16_lazily: bool

    def integer_amax_is_fast(self, xla: bool) -> bool:
        """Returns whether an amax may reduce bit patterns as 16/32-bit integers."""

    def install_step(
        self,
        model: Any,
        recorder: StepRecorder,
        owners: Mapping[int, int],
        replace: Replace,
    ) -> None:
        """Wraps the model's train step and its optimizer so that each step is recorded."""

    def watch_gradient(self, recorder: StepRecorder, trace: Any, index: int, value: Any) -> Any:
        """Returns `value` through an identity whose gradient's amax is recorded for layer `index`."""

    def read_history(self) -> np.ndarray:
        """Returns the history `[steps, rows, slots]`, combined over replicas (largest values)."""

    def read_count(self) -> int:
        """Returns how many steps were recorded."""

    def read_status(self) -> np.ndarray:
        """Returns the int32 status `[failed, near_range]` set since the last clear."""

    def clear_status(self) -> None:
        """Resets the status (from the host, between steps)."""
