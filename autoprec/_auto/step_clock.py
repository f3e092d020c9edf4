"""What the first steps of `fit` tell the decision: the epoch's length and what a trace costs.

The one-liner's decision may spend a share of the first epoch (`decision_budget`).
Most of what it spends on a large model is tracing: each candidate the race times,
and each whole step `calibrate` times, is one more trace of the train step. The
first step of `fit` is one such trace (plus one step), so `StepClock` reads both
figures off the steps `fit` already ran, before anything else is traced.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

#: Steps `fit` runs before an unprofiled decision: the first (its trace) and two that time a step.
UNPROFILED_STEPS = 3


@dataclasses.dataclass
class StepClock:
    """Records when each of `fit`'s first steps ended, from the start of training.

    Attributes:
        started: `time.perf_counter()` when training began.
        ends: seconds from `started` to the end of each step recorded so far.
    """

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
        """Returns what tracing the train step cost: the first step less a later one's time.

        Returns:
            Seconds, or `None` before a step was recorded (the first step alone
            when no later one was: an upper bound).

        Example:

        ```python
        clock = StepClock(started=0.0, ends=[4.2, 4.3, 4.4])
        round(clock.trace_seconds(), 2)  # 4.1
        ```
        """
        if not self.ends:
            return None
        return max(self.ends[0] - (self.step_seconds() or 0.0), 0.0)

    def epoch_estimate(self, steps_per_epoch: int | None) -> float | None:
        """Returns the first epoch's length: its trace and first step, then its other steps.

        Args:
            steps_per_epoch: steps of an epoch (`fit`'s `params["steps"]`), or `None`.

        Returns:
            Seconds, or `None` when the epoch's steps or the first step are unknown.

        Example:

        ```python
        StepClock(started=0.0, ends=[4.2, 4.3, 4.4]).epoch_estimate(30)  # 4.2 + 29 * 0.1
        ```
        """
        if not steps_per_epoch or not self.ends:
            return None
        step = self.step_seconds()
        if step is None:
            return self.ends[0] * steps_per_epoch
        return self.ends[0] + (steps_per_epoch - 1) * step
