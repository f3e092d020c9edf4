"""What both backends' guard-telemetry hooks share: their installation and how a frame enters the history.

`tensorflow_telemetry.TelemetryHooks` and `jax_telemetry.TelemetryHooks`
implement the `telemetry.TelemetryHooks` protocol on top of
`TelemetryHooksBase`: each lists the methods it wraps (`step_wrappers`) and
watches gradients its own way, and both append a step's frame to the history
and raise the status with `advance_history`, in-graph with `keras.ops` on
TensorFlow and on the host with NumPy on JAX. This module imports neither
framework.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .telemetry import Replace, StepRecorder

#: Length of the status: `[failed, near_range]`.
STATUS_SLOTS = 2


def cleared_status() -> np.ndarray:
    """Returns the status with no flag raised.

    Returns:
        int32 zeros `[STATUS_SLOTS]` (`[failed, near_range]`).

    Example:

    ```python
    cleared_status().tolist()  # [0, 0]
    ```
    """
    return np.zeros(STATUS_SLOTS, np.int32)


def advance_history(
    recorder: StepRecorder, frame: Any, history: Any, status: Any, xp: Any
) -> tuple[Any, Any]:
    """Returns the history with `frame` appended and the status raised by `frame`'s flags.

    The flags are the recorder's (`StepRecorder.status_flags`) for `frame`
    after `history`; the oldest frame of the history is dropped, and a flag
    once raised stays raised until the status is cleared.

    Args:
        recorder: the telemetry.
        frame: the step's frame, `[rows, slots]` float32.
        history: the frames before it, `[steps, rows, slots]`.
        status: the int32 status `[failed, near_range]` so far.
        xp: `numpy` (on the host) or `keras.ops` (inside the step).

    Returns:
        `(history, status)`: the new history, same shape, and the new int32 status.

    Example:

    ```python
    history, status = advance_history(telemetry, frame, history, cleared_status(), np)
    ```
    """
    failed, near = recorder.status_flags(frame, history, xp)
    history = xp.concatenate([history[1:], frame[None]], axis=0)
    return history, xp.maximum(status, xp.stack([failed, near]))


class TelemetryHooksBase(abc.ABC):
    """The part of the telemetry's `TelemetryHooks` that is the same on every backend.

    A backend's hooks keep the history `[steps, rows, slots]`, the step count
    and the status, list the methods they wrap (`step_wrappers`) and watch
    the activation gradients (`watch_gradient`); `install_step` puts the
    wrappers in place. Each is built from the history's first value.

    Args:
        history: the history's first value, `[steps, rows, slots]` float32.

    Example:

    ```python
    hooks = telemetry_backend().TelemetryHooks(np.full((16, 3, 4), -1.0, np.float32))
    hooks.read_count()  # 0
    ```
    """

    #: Whether bfloat16 layers are measured only in a failing step (a conditional branch).
    measures_bfloat16_lazily: bool = False

    def install_step(
        self, model: Any, recorder: StepRecorder, owners: Mapping[int, int], replace: Replace
    ) -> None:
        """Puts the backend's `step_wrappers` in place, each with `replace`.

        Args:
            model: the compiled model.
            recorder: the telemetry.
            owners: `{id(variable): recorded layer index}` of the trainable weights.
            replace: sets a method for as long as the telemetry is installed.
        """
        for owner, name, wrapper in self.step_wrappers(model, recorder, owners):
            replace(owner, name, wrapper)

    @abc.abstractmethod
    def step_wrappers(
        self, model: Any, recorder: StepRecorder, owners: Mapping[int, int]
    ) -> list[tuple[object, str, Callable]]:
        """Returns `(owner, method name, wrapper)` for each method `install_step` replaces.

        Every wrapper is built from the method it replaces before any is put in place.
        """

    @abc.abstractmethod
    def watch_gradient(self, recorder: StepRecorder, trace: Any, index: int, value: Any) -> Any:
        """Returns `value` through an identity whose gradient's amax is recorded for layer `index`.

        Called on each float output of a float16 layer while the step is
        traced; the amax reaches the frame of that same step.

        Args:
            recorder: the telemetry.
            trace: the step's trace.
            index: the recorded layer's index.
            value: a float output of the layer.

        Returns:
            The value to pass on.
        """
