"""What the first steps of `fit` tell the decision: the epoch's length and what a trace costs."""

from __future__ import annotations

import dataclasses
import statistics
import time

#: Steps `fit` runs before an unprofiled decision: the first (its trace) and two that time a step.
UNPROFILED_STEPS = 3


@dataclasses.dataclass
class StepClock:
    """Records when each of `fit`'s first steps ended, from the start of training."""

    started: float = dataclasses.field(default_factory=time.perf_counter)
    ends: list[float] = dataclasses.field(default_factory=list)

    def step_ended(self) -> None:
        """Records the end of one more step."""
        self.ends.append(time.perf_counter() - self.started)

    @property
    def steps(self) -> int:
        """Steps recorded."""
        return len(self.ends)

    def step_seconds(self) -> float | None:
        """Returns the median seconds of a step after the first (traced) one, or `None`."""
        if len(self.ends) < 2:
            return None
        return statistics.median(b - a for a, b in zip(self.ends, self.ends[1:]))

    def trace_seconds(self) -> float | None:
        """Returns what tracing the train step cost: the first step less a later one's time."""
        if not self.ends:
            return None
        return max(self.ends[0] - (self.step_seconds() or 0.0), 0.0)

    def epoch_estimate(self, steps_per_epoch: int | None) -> float | None:
        """Returns the first epoch's length: its trace and first step, then its other steps."""
        if not steps_per_epoch or not self.ends:
            return None
        step = self.step_seconds()
        if step is None:
            return self.ends[0] * steps_per_epoch
        return self.ends[0] + (steps_per_epoch - 1) * step
