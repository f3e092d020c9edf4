"""One interleaved timer: several functions timed side by side, in rotating rounds."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds of each timed call of one function."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        """Median seconds of one call."""
        return float(statistics.median(self.samples))

    @property
    def minimum(self) -> float:
        """Fastest call's seconds."""
        return float(min(self.samples))


def _timed_call(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def time_interleaved(
    functions: Mapping[str, Callable[[], object]],
    rounds: int,
    warmup: int = 1,
    slow_seconds: float | None = None,
    slow_factor: float | None = None,
    slow_rounds: int = 2,
) -> dict[str, Timing]:
    """Times several functions in alternating rounds whose order rotates."""
    warm: dict[str, float] = {}
    for name, function in functions.items():
        for _ in range(max(warmup - 1, 0)):
            function()
        warm[name] = _timed_call(function)
    fastest = min(warm.values(), default=0.0)

    def is_slow(name: str) -> bool:
        if slow_seconds is not None and warm[name] > slow_seconds:
            return True
        return slow_factor is not None and warm[name] > slow_factor * fastest

    fast = [name for name in functions if not is_slow(name)]
    samples: dict[str, list[float]] = {name: [] for name in functions}
    for round_index in range(max(rounds, 1)):
        shift = round_index % len(fast) if fast else 0
        for name in fast[shift:] + fast[:shift]:
            samples[name].append(_timed_call(functions[name]))
    for name in functions:
        if name not in fast:
            samples[name] = [_timed_call(functions[name]) for _ in range(max(slow_rounds, 1))]
    return {name: Timing(tuple(values)) for name, values in samples.items()}
