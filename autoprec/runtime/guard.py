"""The runtime guard: detect overflow in training, find the layer where it starts, promote it.

On TensorFlow, detection and attribution come from `autoprec.runtime.telemetry`:
every step, inside the compiled train step, each 16-bit layer records the
largest magnitude of its outputs, inputs, attention logits and gradients, and
the host reads one status flag per step. When a step fails, `attribute_step`
names the cause from that very step: the input batch (the data's fault,
nothing promoted), the layers whose forward values left their format's range
while their inputs were finite (all of them, promoted at once), or the
backward pass (the loss scale is lowered first, below 1 if need be, and the
layers are promoted only when no scale can help). `climbing_layers` finds
float16 layers whose amax history climbs toward 65504, promoted before they
overflow.

Where the telemetry cannot run (a backend other than TensorFlow and JAX), the
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
import enum
import logging
import math
from collections.abc import Mapping

from .._core.config import ConfigValue
from .._core.dtypes import BFLOAT16, FLOAT16, FLOAT32, widen, wider_dtypes
from ..errors import AutoprecError
from ..profiler import Profile, TensorStats
from .telemetry import FORMAT_MAX, NOT_RECORDED, LayerAmax, StepRecord, is_out_of_range

logger = logging.getLogger("autoprec")

ON_NAN_MODES = ("promote", "stop", "raise")


class NonFiniteTrainingError(AutoprecError, RuntimeError):
    """Training produced non-finite values and the guard was told to raise."""


@dataclasses.dataclass(frozen=True)
class Guard(ConfigValue):
    """Settings of the runtime guard, which watches training for overflow and promotes the layer where it starts.

    Pass one as `AutoPrecision(plan, guard=autoprec.Guard(...))`; `guard=None`
    turns the guard (and the kernel check) off. A `Guard` is a frozen value:
    build it once, print it, reuse it across callbacks; `get_config()` and
    `Guard.from_config(config)` round-trip it through a plain dict.

    Attributes:
        on_nan: `"promote"` (find the layer and promote it), `"stop"` (stop
            training with a report) or `"raise"` (raise `NonFiniteTrainingError`).
            A non-finite loss with every layer in float32 is reported as a real
            divergence and stops training.
        threshold: bad steps within `window` steps that trigger the guard where
            the in-step telemetry cannot run (backends other than TensorFlow and
            JAX); a loss scale
            at its floor that still overflows triggers it at once.
        window: steps over which bad steps are counted.
        check_every: steps between reads of the loss-scale optimizer's counters.
        diagnose_steps: steps profiled to find the layer where overflow starts.
        bfloat16_is_fast: whether float16 layers may be promoted to bfloat16
            (where the hardware runs bfloat16 fast); `False` promotes to float32.
        min_loss_scale: the lowest loss scale the guard sets for gradients that
            overflow float16 even at the configured floor.
        history_steps: steps of per-layer amax history kept on the device.
        near_binades: a float16 layer whose amax climbs within this many binades
            of 65504 is promoted before it overflows.
        check_kernels: before training, run each 16-bit layer once alone; a layer
            whose dtype has no kernel on this device falls back (float16 ->
            bfloat16 -> float32), logged and recorded in `plan.events`.

    Raises:
        AutoprecError: for an `on_nan` other than the three modes, a count below
            1, a scale or binade count that is not positive, or a flag that is
            not a bool; the message names the field and what it accepts.

    Example:

    ```python
    guard = autoprec.Guard(on_nan="raise", check_kernels=False)
    model.fit(x, y, callbacks=[autoprec.AutoPrecision(plan, guard=guard)])
    ```
    """

    on_nan: str = "promote"
    threshold: int = 8
    window: int = 100
    check_every: int = 10
    diagnose_steps: int = 3
    bfloat16_is_fast: bool = True
    min_loss_scale: float = 2.0**-10
    history_steps: int = 16
    near_binades: float = 2.0
    check_kernels: bool = True

    def __post_init__(self) -> None:
        if self.on_nan not in ON_NAN_MODES:
            raise AutoprecError(
                f"Guard: on_nan={self.on_nan!r} is not valid; use one of "
                f"{', '.join(repr(mode) for mode in ON_NAN_MODES)}."
            )
        for name in ("threshold", "window", "check_every", "diagnose_steps", "history_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AutoprecError(f"Guard: {name} must be an integer >= 1, got {value!r}.")
        for name in ("min_loss_scale", "near_binades"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise AutoprecError(f"Guard: {name} must be a positive number, got {value!r}.")
        for name in ("bfloat16_is_fast", "check_kernels"):
            if not isinstance(getattr(self, name), bool):
                raise AutoprecError(
                    f"Guard: {name} must be True or False, got {getattr(self, name)!r}."
                )


def promotion_target(dtype: str, bfloat16_is_fast: bool) -> str:
    """Returns the dtype a layer that overflows in `dtype` is promoted to.

    The next wider dtype on the widening ladder (float16 -> bfloat16 -> float32),
    skipping bfloat16 where it does not run fast; float32 stays float32.

    Args:
        dtype: the layer's current compute dtype.
        bfloat16_is_fast: whether the device runs bfloat16 fast.

    Returns:
        `"bfloat16"` or `"float32"`.

    Example:

    ```python
    promotion_target("float16", bfloat16_is_fast=False)  # "float32"
    ```
    """
    allowed = (FLOAT32, BFLOAT16) if bfloat16_is_fast else (FLOAT32,)
    wider = wider_dtypes(dtype)
    return widen(wider[0], allowed) if wider else FLOAT32


def find_culprit(profile: Profile, dtypes: Mapping[str, str]) -> tuple[str, str] | None:
    """Returns `(path, evidence)` of the 16-bit layer where non-finite values or overflow start.

    Forward values are searched first, in model order (an overflow propagates
    forward to every later layer); then activation gradients in reverse model
    order (the backward pass starts at the loss and propagates toward the inputs).

    Args:
        profile: an `autoprec.profiler.Profile` recorded while training with the plan.
        dtypes: `{path: dtype}` the layers compute in, in model order.

    Returns:
        The layer where the problem starts, or `None` if no 16-bit layer shows one.

    Example:

    ```python
    culprit = find_culprit(prof, {"dense": "float16", "head": "float32"})
    ```
    """
    if enters_with_the_data(profile):
        return None
    candidates = [
        path for path, dtype in dtypes.items() if dtype != FLOAT32 and path in profile.layers
    ]
    for path in candidates:
        layer = profile.layers[path]
        forward = {"activation": layer.activation, **dict(layer.internals)}
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


def enters_with_the_data(profile: Profile) -> bool:
    """Returns whether the first recorded layer already sees NaN (not inf) in its forward values.

    An overflow produces infinities where it happens; NaN in the very first
    layer, before any layer could overflow, came in with the input batch.

    Args:
        profile: an `autoprec.profiler.Profile` recorded while training.

    Returns:
        `True` when every non-finite activation of the first layer is NaN.

    Example:

    ```python
    enters_with_the_data(prof)  # True when the input batches held NaN
    ```
    """
    first = next(iter(profile.layers.values()), None)
    stats = first.activation if first is not None else None
    return bool(stats is not None and stats.nonfinite and stats.nan == stats.nonfinite)


def _problem(stats: TensorStats | None, dtype: str, what: str) -> str | None:
    if stats is None:
        return None
    if stats.nonfinite:
        return f"{stats.nonfinite} non-finite {what} value(s)"
    if dtype == FLOAT16 and stats.float16_overflow_fraction > 0:
        return f"{stats.float16_overflow_fraction:.2%} of {what} values above float16's max 65504"
    return None


class GuardPhase(enum.Enum):
    """Where the guard is: watching the counters, diagnosing a trigger, or done."""

    WATCHING = "watching"
    DIAGNOSING = "diagnosing"
    STOPPED = "stopped"


class GuardAction(enum.Enum):
    """What the guard does about a trigger (see `GuardState.action`)."""

    DIAGNOSE = "diagnose"
    STOP = "stop"
    RAISE = "raise"
    DIVERGED = "diverged"


class GuardState:
    """The guard's step logic between checks: plain values, no Keras objects.

    The guard is `WATCHING` until a check finds a trigger; it then either stops
    (`STOPPED`) or profiles a few steps (`DIAGNOSING`) and, once it has acted on
    the diagnosis, watches again with its window counted afresh.

    Args:
        config: the guard's settings, a `Guard`.

    Example:

    ```python
    state = GuardState(Guard(threshold=3))
    state.observe(step=10, non_finite_total=3, scale=512.0, floor=1.0)  # True: 3 bad steps
    ```
    """

    def __init__(self, config: Guard) -> None:
        self.config = config
        self.phase = GuardPhase.WATCHING
        self.last_non_finite = 0
        self.recent: list[tuple[int, int]] = []  # (step, new bad steps)
        self.trigger = ""

    @property
    def bad_steps_in_window(self) -> int:
        """Non-finite steps counted within the window at the last check."""
        return sum(count for _, count in self.recent)

    def is_check_due(self, step: int) -> bool:
        """Returns whether the counters should be read after `step` (watching, every `check_every`)."""
        return self.phase is GuardPhase.WATCHING and step % self.config.check_every == 0

    def observe(self, step: int, non_finite_total: int, scale: float, floor: float | None) -> bool:
        """Records the counters read at `step`; returns whether the guard should act."""
        new = max(0, non_finite_total - self.last_non_finite)
        self.last_non_finite = non_finite_total
        if new:
            self.recent.append((step, new))
        self.recent = [(s, n) for s, n in self.recent if step - s < self.config.window]
        collapsed = floor is not None and new > 0 and scale <= floor
        return self.bad_steps_in_window >= self.config.threshold or collapsed

    def check(
        self,
        step: int,
        loss: object,
        counters: tuple[int, float, float | None] | None,
    ) -> str | None:
        """Returns the trigger at `step` (also kept in `trigger`), or `None` if all is well.

        Args:
            step: train steps so far.
            loss: the step's logged loss.
            counters: `(non-finite steps in total, loss scale, floor)` read from a
                `FlooredLossScaleOptimizer`, or `None` without one (the loss is
                checked instead).

        Returns:
            Why the guard acts, for messages and events, or `None`.
        """
        if counters is not None:
            non_finite_total, scale, floor = counters
            if not self.observe(step, non_finite_total, scale, floor):
                return None
            self.trigger = (
                f"{self.bad_steps_in_window} non-finite step(s) in the last "
                f"{self.config.window} steps, loss scale {scale:g}"
            )
        elif is_finite_number(loss):
            return None
        else:
            self.trigger = f"non-finite loss at step {step}"
        return self.trigger

    def action(self, has_16bit_layers: bool) -> GuardAction:
        """Returns what to do about the current trigger, and moves to the matching phase.

        Args:
            has_16bit_layers: whether any layer computes in float16 or bfloat16.

        Returns:
            `DIVERGED` when every layer is float32 (not a precision problem), else
            `RAISE`, `STOP` or `DIAGNOSE` as `config.on_nan` says.
        """
        if not has_16bit_layers:
            choice = GuardAction.DIVERGED
        elif self.config.on_nan == "raise":
            choice = GuardAction.RAISE
        elif self.config.on_nan == "stop":
            choice = GuardAction.STOP
        else:
            choice = GuardAction.DIAGNOSE
        self.phase = GuardPhase.DIAGNOSING if choice is GuardAction.DIAGNOSE else GuardPhase.STOPPED
        return choice

    def stop(self) -> None:
        """Stops watching for the rest of this `fit` (a divergence was reported)."""
        self.phase = GuardPhase.STOPPED

    def restart(self) -> None:
        """Watches again at the start of another `fit`; the window is kept, as the counters are."""
        self.phase = GuardPhase.WATCHING

    def resume(self) -> None:
        """Watches again after a diagnosis or promotion, counting the window afresh."""
        self.phase = GuardPhase.WATCHING
        self.recent.clear()


def is_finite_number(value: object) -> bool:
    """Returns whether a logged value is a finite number (non-numbers count as finite).

    Args:
        value: a value from Keras' logs.

    Returns:
        `False` only for a number that is NaN or infinite.

    Example:

    ```python
    is_finite_number(float("nan"))  # False
    ```
    """
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True


# ---------------------------------------------------------------------------- telemetry


@dataclasses.dataclass(frozen=True)
class Attribution:
    """Where the non-finite values of a failed step came from.

    Attributes:
        cause: `"data"` (the input batch was non-finite), `"forward"` (16-bit
            layers' forward values left their range), `"backward"` (only
            gradients did) or `"elsewhere"` (no 16-bit layer shows it).
        layers: the implicated layers, in model order for `"forward"`, in
            backward order for `"backward"`.
        evidence: `{path: figures}` for each implicated layer.
        summary: one sentence for messages and events.
    """

    cause: str
    layers: tuple[str, ...] = ()
    evidence: Mapping[str, str] = dataclasses.field(default_factory=dict)
    summary: str = ""


def _figure(value: float) -> str:
    return "not recorded" if value == NOT_RECORDED else f"{value:.4g}"


def _forward_evidence(amax: LayerAmax, dtype: str) -> str:
    what = "attention logits" if is_out_of_range(amax.internal, dtype) else "outputs"
    value = amax.internal if what == "attention logits" else amax.output
    kind = "non-finite" if not math.isfinite(value) else "out-of-range"
    return (
        f"{kind} {dtype} {what} (amax {_figure(value)}; inputs amax {_figure(amax.input)}; "
        f"{dtype}'s max is {FORMAT_MAX.get(dtype, FORMAT_MAX[FLOAT32]):.6g})"
    )


def attribute_step(record: StepRecord, dtypes: Mapping[str, str]) -> Attribution:
    """Returns what made a recorded step non-finite, from that step's own amax values.

    The input batch first (NaN or inf already there is the data's fault); then
    the forward pass: every 16-bit layer whose outputs or attention logits left
    its format's range while its inputs were finite (several in one step are
    all implicated; when none had finite inputs, the first out-of-range layer in
    model order); then the backward pass: the layers whose gradients left their
    range, from the loss toward the inputs.

    Args:
        record: a `StepRecord` from `GuardTelemetry.read_records`.
        dtypes: `{path: dtype}` the layers computed in.

    Returns:
        An `Attribution`.

    Example:

    ```python
    attribution = attribute_step(telemetry.read_records()[-1], handle.dtypes)
    attribution.cause, attribution.layers  # ("forward", ("big",))
    ```
    """
    if not record.batch_finite:
        return Attribution(
            "data",
            summary=f"NaN entered with the input data (the input batch's amax is "
            f"{record.batch_amax:g}): the NaN came with the data, not from a 16-bit layer",
        )
    paths = [path for path in record.layers if dtypes.get(path, FLOAT32) != FLOAT32]
    forward = [
        path
        for path in paths
        if is_out_of_range(record.layers[path].output, dtypes[path])
        or is_out_of_range(record.layers[path].internal, dtypes[path])
    ]
    if forward:
        implicated = [
            path for path in forward if not is_out_of_range(record.layers[path].input, dtypes[path])
        ] or forward[:1]
        evidence = {
            path: _forward_evidence(record.layers[path], dtypes[path]) for path in implicated
        }
        return Attribution(
            "forward",
            tuple(implicated),
            evidence,
            "; ".join(f"{path}: {text}" for path, text in evidence.items()),
        )
    backward = [
        path
        for path in reversed(paths)
        if is_out_of_range(record.layers[path].gradient, dtypes[path])
    ]
    if backward:
        evidence = {
            path: f"{dtypes[path]} gradients amax {_figure(record.layers[path].gradient)} at "
            f"loss scale {record.loss_scale:g} ({dtypes[path]}'s max is "
            f"{FORMAT_MAX.get(dtypes[path], FORMAT_MAX[FLOAT32]):.6g})"
            for path in backward
        }
        return Attribution(
            "backward",
            tuple(backward),
            evidence,
            f"gradients left the 16-bit range in {', '.join(backward)} at loss scale "
            f"{record.loss_scale:g}",
        )
    return Attribution(
        "elsewhere",
        summary="non-finite gradients outside the 16-bit layers (a float32 layer or the loss)",
    )


def lowered_loss_scale(scale: float, failures_in_a_row: int, minimum: float) -> float:
    """Returns the loss scale to try after gradients overflowed `failures_in_a_row` steps running.

    The scale drops by 1, 2, 4, then 8 binades per failed step (a power of two
    throughout), so a scale far too large for the gradients is found in a few
    steps rather than one halving per step; never below `minimum`.

    Args:
        scale: the loss scale the failed step ran with.
        failures_in_a_row: failed steps so far in this run of failures (1 or more).
        minimum: the lowest scale allowed.

    Returns:
        The new loss scale.

    Example:

    ```python
    lowered_loss_scale(32768.0, 3, 2.0**-10)  # 2048.0
    ```
    """
    binades = min(8, 2 ** max(0, failures_in_a_row - 1))
    return max(float(minimum), float(scale) / 2.0**binades)


def climbing_layers(
    records: list[StepRecord], dtypes: Mapping[str, str], binades: float = 2.0
) -> dict[str, str]:
    """Returns the float16 layers whose amax history climbs toward 65504, with the figures.

    A layer climbs when its latest forward amax (outputs or attention logits)
    is within `binades` binades of 65504, is the largest of its history, and
    the later half of its history is larger on average than the earlier half.
    Non-finite and unrecorded values are left out.

    Args:
        records: the telemetry's history, oldest first (at least 4 steps).
        dtypes: `{path: dtype}` the layers compute in.
        binades: how close to 65504 the latest amax must be.

    Returns:
        `{path: evidence}` for each climbing float16 layer.

    Example:

    ```python
    climbing_layers(telemetry.read_records(), handle.dtypes)  # {"dense_3": "amax ..."}
    ```
    """
    threshold = FORMAT_MAX[FLOAT16] / 2.0**binades
    found: dict[str, str] = {}
    if not records:
        return found
    for path in records[-1].layers:
        if dtypes.get(path) != FLOAT16:
            continue
        series = [
            record.layers[path].forward
            for record in records
            if path in record.layers
            and record.layers[path].forward != NOT_RECORDED
            and math.isfinite(record.layers[path].forward)
        ]
        if len(series) < 4 or series[-1] < threshold or series[-1] < max(series):
            continue
        half = len(series) // 2
        early = sum(series[:half]) / half
        late = sum(series[half:]) / (len(series) - half)
        if late <= early:
            continue
        found[path] = (
            f"float16 amax climbing toward 65504: {series[0]:.4g} -> {series[-1]:.4g} over "
            f"{len(series)} steps ({math.log2(FORMAT_MAX[FLOAT16] / series[-1]):.2f} binades "
            "of headroom left)"
        )
    return found
