"""The runtime guard: detect overflow in training, find the layer where it starts, promote it.

Detection is cheap and happens inside the compiled step: the
`FlooredLossScaleOptimizer` counts steps with non-finite gradients (which it
skips). Every `check_every` steps the guard reads those counters. When at least
`threshold` bad steps happened within `window` steps, or the loss scale sits at
its floor while steps keep overflowing (a collapsing scale), the guard profiles
the next few steps with the profiler's in-graph probes and promotes the first
16-bit layer, in model order, whose activations or activation gradients are
non-finite or overflow float16: float16 goes to bfloat16 where the hardware runs
it fast, else to float32; bfloat16 goes to float32. The loss scale is reset, the
compiled functions are rebuilt, and the event is recorded in the plan. NaN in
the first layer's forward values (before any layer could overflow, which gives
infinities) means the data brought it: that is reported, and nothing is promoted.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

from ._core.dtypes import BFLOAT16, FLOAT16, FLOAT32
from .errors import AutoprecError

logger = logging.getLogger("autoprec")

ON_NAN_MODES = ("promote", "stop", "raise")


class NonFiniteTrainingError(AutoprecError, RuntimeError):
    """Training produced non-finite values and the guard was told to raise."""


@dataclasses.dataclass
class GuardConfig:
    """Settings of the runtime guard.

    Attributes:
        on_nan: `"promote"` (find the layer and promote it), `"stop"` (stop
            training with a report) or `"raise"` (raise `NonFiniteTrainingError`).
        threshold: bad steps within `window` steps that trigger the guard.
        window: steps over which bad steps are counted.
        check_every: steps between reads of the in-graph counters.
        diagnose_steps: steps profiled to find the layer where overflow starts.
        bfloat16_is_fast: whether float16 layers may be promoted to bfloat16.
    """

    on_nan: str = "promote"
    threshold: int = 8
    window: int = 100
    check_every: int = 10
    diagnose_steps: int = 3
    bfloat16_is_fast: bool = True

    def __post_init__(self) -> None:
        if self.on_nan not in ON_NAN_MODES:
            raise AutoprecError(
                f"on_nan={self.on_nan!r} is not valid; use one of {', '.join(ON_NAN_MODES)}."
            )
        for name in ("threshold", "window", "check_every", "diagnose_steps"):
            if getattr(self, name) < 1:
                raise AutoprecError(f"guard {name} must be at least 1, got {getattr(self, name)}.")


def promotion_target(dtype: str, bfloat16_is_fast: bool) -> str:
    """Returns the dtype a layer is promoted to from `dtype`."""
    if dtype == FLOAT16 and bfloat16_is_fast:
        return BFLOAT16
    return FLOAT32


def find_culprit(profile: Any, dtypes: dict[str, str]) -> tuple[str, str] | None:
    """Returns `(path, evidence)` of the 16-bit layer where non-finite values or overflow start.

    Forward values are searched first, in model order (an overflow propagates
    forward to every later layer); then activation gradients in reverse model
    order (the backward pass starts at the loss and propagates toward the inputs).

    Args:
        profile: an `autoprec.profiler.Profile` recorded while training with the plan.
        dtypes: `{path: dtype}` the layers compute in, in model order.

    Returns:
        The layer where the problem starts, or `None` if no 16-bit layer shows one.
    """
    if enters_with_the_data(profile):
        return None
    candidates = [
        path for path, dtype in dtypes.items() if dtype != FLOAT32 and path in profile.layers
    ]
    for path in candidates:
        layer = profile.layers[path]
        forward = {"activation": layer.activation, **dict(layer.internals or {})}
        for name, stats in forward.items():
            evidence = _problem(stats, dtypes[path], name.replace("_", " "))
            if evidence:
                return path, evidence
    for path in reversed(candidates):
        evidence = _problem(
            profile.layers[path].activation_gradient, dtypes[path], "activation gradient"
        )
        if evidence:
            return path, evidence
    return None


def enters_with_the_data(profile: Any) -> bool:
    """Whether the first recorded layer already sees NaN (not inf) in its forward values.

    An overflow produces infinities where it happens; NaN in the very first
    layer, before any layer could overflow, came in with the input batch.
    """
    first = next(iter(profile.layers.values()), None)
    stats = getattr(first, "activation", None)
    return bool(stats is not None and stats.nonfinite and stats.nan == stats.nonfinite)


def _problem(stats: Any, dtype: str, what: str) -> str | None:
    if stats is None:
        return None
    if stats.nonfinite:
        return f"{stats.nonfinite} non-finite {what} value(s)"
    if dtype == FLOAT16 and stats.float16_overflow_fraction > 0:
        return f"{stats.float16_overflow_fraction:.2%} of {what} values above float16's max 65504"
    return None


class GuardState:
    """Bookkeeping of the guard between checks (plain values, no Keras objects)."""

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self.last_non_finite = 0
        self.recent: list[tuple[int, int]] = []  # (step, new bad steps)
        self.diagnosing_since: int | None = None

    def observe(self, step: int, non_finite_total: int, scale: float, floor: float | None) -> bool:
        """Records the counters read at `step`; returns whether the guard should act."""
        new = max(0, non_finite_total - self.last_non_finite)
        self.last_non_finite = non_finite_total
        if new:
            self.recent.append((step, new))
        self.recent = [(s, n) for s, n in self.recent if step - s < self.config.window]
        bad_in_window = sum(n for _, n in self.recent)
        collapsed = floor is not None and new > 0 and scale <= floor
        return bad_in_window >= self.config.threshold or collapsed


def is_finite_number(value: Any) -> bool:
    """Returns whether a logged value is a finite number (non-numbers count as finite)."""
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True
