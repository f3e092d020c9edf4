"""What the guard's telemetry records: the frame layout, the record types and format limits.

Each train step's values form one float32 *frame* of `rows = layers + 1` rows
and `len(SLOTS)` columns. Row 0 is the header (loss scale, batch amax, 1.0
when a gradient was non-finite, unused); row `index + 1` holds the maxima of
`|x|` recorded layer `index` had in each slot, `NOT_RECORDED` where nothing
was. The telemetry keeps the last frames as a history and turns them into
`StepRecord`s here. Format limits come from `autoprec.numerics` (which reads
them from `ml_dtypes.finfo`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import numerics
from .._core.dtypes import BFLOAT16, FLOAT16, FLOAT32

#: What is recorded for every 16-bit layer, in this order.
SLOTS = ("output", "input", "internal", "gradient")
OUTPUT, INPUT, INTERNAL, GRADIENT = range(len(SLOTS))
#: The value of a slot nothing was recorded in.
NOT_RECORDED = -1.0
#: `NOT_RECORDED` as the int32 bits of a float32 (how an amax travels inside a step).
NOT_RECORDED_BITS = int(np.array(NOT_RECORDED, np.float32).view(np.int32))
#: Header columns of row 0 of a frame.
HEADER_LOSS_SCALE, HEADER_BATCH_AMAX, HEADER_GRADIENTS_BAD = range(3)
#: The largest finite value of each compute dtype, from `numerics` (`ml_dtypes.finfo`).
FORMAT_MAX: Mapping[str, float] = {
    name: numerics.float_format(name).max for name in (FLOAT16, BFLOAT16, FLOAT32)
}


def frame_segment(index: int, slot: int) -> int:
    """Returns the flat position in a frame of recorded layer `index`'s `slot`.

    Args:
        index: the layer's position among the recorded layers (row `index + 1`).
        slot: one of `OUTPUT`, `INPUT`, `INTERNAL`, `GRADIENT`.

    Returns:
        `(index + 1) * len(SLOTS) + slot`.

    Example:

    ```python
    frame_segment(0, GRADIENT)  # 7
    ```
    """
    return (index + 1) * len(SLOTS) + slot


def format_max(dtype: str) -> float:
    """Returns the largest finite value of a compute dtype (float32's for unknown names).

    Args:
        dtype: `"float16"`, `"bfloat16"` or `"float32"`.

    Returns:
        65504.0 for float16, about 3.39e38 for bfloat16, 3.40e38 for float32.

    Example:

    ```python
    format_max("float16")  # 65504.0
    ```
    """
    return FORMAT_MAX.get(dtype, FORMAT_MAX[FLOAT32])


def is_out_of_range(value: float, dtype: str) -> bool:
    """Returns whether a recorded amax is non-finite or above `dtype`'s largest value.

    Args:
        value: a recorded maximum magnitude (`NOT_RECORDED` counts as in range).
        dtype: the compute dtype the value had to fit.

    Returns:
        `True` when the value left the format's range.

    Example:

    ```python
    is_out_of_range(float("inf"), "bfloat16")  # True
    ```
    """
    if value == NOT_RECORDED:
        return False
    return not math.isfinite(value) or value > format_max(dtype)


@dataclasses.dataclass(frozen=True)
class LayerAmax:
    """The maxima of `|x|` one layer recorded in one step (`NOT_RECORDED` where nothing was).

    Attributes:
        output: of its float outputs.
        input: of its float inputs, in its compute dtype.
        internal: of intermediates that can overflow inside it (attention logits).
        gradient: of the gradients of its outputs and weights, under the loss scale.
    """

    output: float = NOT_RECORDED
    input: float = NOT_RECORDED
    internal: float = NOT_RECORDED
    gradient: float = NOT_RECORDED

    @property
    def forward(self) -> float:
        """The largest of `output` and `internal` (NaN when either is NaN)."""
        values = (self.output, self.internal)
        if any(math.isnan(value) for value in values):
            return math.nan
        return max(values)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """What the telemetry recorded for one train step.

    Attributes:
        index: the step's number among the steps recorded since installing (1-based).
        loss_scale: the loss scale the step ran with (1.0 without scaling).
        batch_amax: the largest magnitude in the step's input batch (NaN or inf
            when the batch held non-finite values).
        gradients_finite: whether every gradient the optimizer received was finite.
        layers: `{path: LayerAmax}` for every recorded 16-bit layer, in model order.
    """

    index: int
    loss_scale: float
    batch_amax: float
    gradients_finite: bool
    layers: Mapping[str, LayerAmax]

    @property
    def batch_finite(self) -> bool:
        """Whether the input batch held only finite values."""
        return math.isfinite(self.batch_amax)

    @property
    def finite(self) -> bool:
        """Whether nothing in the step was non-finite (batch, layers and gradients)."""
        if not (self.batch_finite and self.gradients_finite):
            return False
        return all(
            value == NOT_RECORDED or math.isfinite(value)
            for amax in self.layers.values()
            for value in dataclasses.astuple(amax)
        )


@dataclasses.dataclass(frozen=True)
class TelemetryStatus:
    """The one small tensor the host reads after each step.

    Attributes:
        failed: a step since the last `clear_status` had non-finite values.
        near_range: a float16 layer set a new amax record within the warning
            distance of float16's largest value.
    """

    failed: bool = False
    near_range: bool = False

    def __bool__(self) -> bool:
        return self.failed or self.near_range


def step_record(frame: np.ndarray, index: int, paths: Sequence[str]) -> StepRecord:
    """Returns the `StepRecord` a host frame spells.

    Args:
        frame: one frame, `[len(paths) + 1, len(SLOTS)]`.
        index: the step's number (1-based).
        paths: the recorded layers' paths, in frame order.

    Returns:
        The record, with a `LayerAmax` per path.

    Example:

    ```python
    frame = np.full((2, 4), NOT_RECORDED, np.float32)
    frame[0] = (1.0, 2.0, 0.0, 0.0)
    step_record(frame, 1, ["dense"]).layers["dense"].output  # -1.0
    ```
    """
    layers = {
        path: LayerAmax(*(float(value) for value in frame[row + 1]))
        for row, path in enumerate(paths)
    }
    return StepRecord(
        index=index,
        loss_scale=float(frame[0, HEADER_LOSS_SCALE]),
        batch_amax=float(frame[0, HEADER_BATCH_AMAX]),
        gradients_finite=not frame[0, HEADER_GRADIENTS_BAD] > 0,
        layers=layers,
    )


def status_flags(
    frame: Any, history: Any, float16: np.ndarray, near_threshold: float, xp: Any
) -> tuple[Any, Any]:
    """Returns `(failed, near_range)` for a new frame, in-graph (`keras.ops`) or on the host (NumPy).

    `failed`: a value of the frame is non-finite or a gradient was.
    `near_range`: a float16 layer's forward amax is at least `near_threshold`,
    finite, and larger than every amax of its history.

    Args:
        frame: the step's frame.
        history: the frames before it, `[steps, rows, slots]`.
        float16: one boolean per recorded layer: whether it computes in float16.
        near_threshold: the amax that counts as near float16's largest value.
        xp: `numpy` or `keras.ops` (the functions used have the same names in both).

    Returns:
        Two boolean scalars of `xp`.

    Example:

    ```python
    status_flags(frame, history, np.array([True]), 16376.0, np)  # (False, False)
    ```
    """
    failed = xp.logical_or(
        xp.logical_not(xp.all(xp.isfinite(frame))),
        xp.greater(frame[0, HEADER_GRADIENTS_BAD], 0.0),
    )
    if not float16.any():
        return failed, xp.array(False)
    current = xp.maximum(frame[1:, OUTPUT], frame[1:, INTERNAL])
    past = xp.max(xp.maximum(history[:, 1:, OUTPUT], history[:, 1:, INTERNAL]), axis=0)
    with np.errstate(invalid="ignore"):  # NaN compares as False on the host, as in-graph
        rising = xp.logical_and(xp.greater(current, past), xp.isfinite(current))
        near = xp.any(
            xp.logical_and(
                float16, xp.logical_and(xp.greater_equal(current, near_threshold), rising)
            )
        )
    return failed, near
