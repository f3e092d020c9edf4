"""`GuardWatch`: what the guard carries between steps, and the read of each step into a
`StepOutcome`."""

from __future__ import annotations

import math
from collections.abc import Mapping

from .._core.dtypes import FLOAT32
from .decision import StepOutcome
from .guard import attribute_step, climbing_layers
from .telemetry import GuardTelemetry


class GuardWatch:
    """The guard's state between steps of a `fit`: its telemetry, the run of failed steps, whether
    it stopped."""

    def __init__(self) -> None:
        self.telemetry: GuardTelemetry | None = None
        self.failures_in_a_row = 0
        self.last_failed_index = -1
        self.stopped = False

    def attach(self, telemetry: GuardTelemetry | None) -> None:
        """Watches through a newly installed `telemetry` (or none), counting failed steps afresh."""
        self.telemetry = telemetry
        self.failures_in_a_row = 0
        self.last_failed_index = -1

    def detach(self) -> None:
        """Removes the telemetry from the model."""
        if self.telemetry is not None:
            self.telemetry.remove()
            self.telemetry = None

    def observe(
        self,
        step: int,
        logs: Mapping[str, object] | None,
        dtypes: Mapping[str, str],
        near_binades: float,
    ) -> StepOutcome | None:
        """Returns what happened in the steps up to `step`, or `None` when there is nothing to act
        on."""
        if self.stopped:
            return None
        telemetry = self.telemetry
        if telemetry is None:
            loss = (logs or {}).get("loss", 0.0)
            if is_finite_number(loss):
                return None
            has_16bit = any(dtype != FLOAT32 for dtype in dtypes.values())
            return StepOutcome(step, loss_finite=False, has_16bit_layers=has_16bit)
        status = telemetry.read_status()
        if not status:
            return None
        records = telemetry.read_records(new_only=True)
        telemetry.clear_status()
        failed = [record for record in records if not record.finite]
        if failed:
            record = failed[0]
            if record.index != self.last_failed_index + 1:
                self.failures_in_a_row = 0
            self.last_failed_index = record.index
            return StepOutcome(
                step - (records[-1].index - record.index),
                attribution=attribute_step(record, dtypes),
                loss_scale=record.loss_scale,
            )
        if status.near_range:
            climbing = climbing_layers(telemetry.read_records(), dtypes, near_binades)
            return StepOutcome(step, climbing=climbing) if climbing else None
        return None


def is_finite_number(value: object) -> bool:
    """Returns whether a logged value is a finite number (non-numbers count as finite)."""
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True
