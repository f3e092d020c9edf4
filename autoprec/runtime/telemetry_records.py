"""What the guard's telemetry records: the frame layout, the record types and format limits."""

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
    """Returns the flat position in a frame of recorded layer `index`'s `slot`."""
    return (index + 1) * len(SLOTS) + slot


def format_max(dtype: str) -> float:
    """Returns the largest finite value of a compute dtype (float32's for unknown names)."""
    return FORMAT_MAX.get(dtype, FORMAT_MAX[FLOAT32])


def is_out_of_range(value: float, dtype: str) -> bool:
    """Returns whether a recorded amax is non-finite or above `dtype`'s largest value."""
    if value == NOT_RECORDED:
        return False
    return not math.isfinite(value) or value > format_max(dtype)


@dataclasses.dataclass(frozen=True)
class LayerAmax:
    """The maxima of `|x|` one layer recorded in one step (`NOT_RECORDED` where nothing was)."""

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
    """What the telemetry recorded for one train step."""

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
    """The one small tensor the host reads after each step."""

    failed: bool = False
    near_range: bool = False

    def __bool__(self) -> bool:
        return self.failed or self.near_range


def step_record(frame: np.ndarray, index: int, paths: Sequence[str]) -> StepRecord:
    """Returns the `StepRecord` a host frame spells."""
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
    """Returns `(failed, near_range)` for a new frame, in-graph (`keras.ops`) or on the host
    (NumPy)."""
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
