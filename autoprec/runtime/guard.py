"""The runtime guard: detect overflow in training, find the layers where it starts, decide what to do
about each step (`decide`, a pure function) and promote the layers."""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
from collections.abc import Mapping
from typing import Any

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32, widen, wider_dtypes
from .._core.models import ConfigValue
from ..errors import AutoprecError
from .telemetry import (
    NOT_RECORDED,
    SKIPPED_STEPS,
    GuardTelemetry,
    LayerAmax,
    StepRecord,
    format_max,
    is_out_of_range,
    near_range_layers,
)

logger = logging.getLogger("autoprec")

ON_NAN_MODES = ("promote", "stop", "raise")

#: Keras backends the guard's in-step telemetry runs on.
GUARD_BACKENDS = ("tensorflow", "jax")

#: `Guard` fields removed in 0.3, with what to write instead (for `Guard.from_config`).
REMOVED_FIELDS = {
    "threshold": "each failing step is attributed from the in-step telemetry; no count of "
    "bad steps triggers the guard, so drop the key",
    "window": "each failing step is attributed from the in-step telemetry; no window of "
    "bad steps is counted, so drop the key",
    "check_every": "the guard reads its telemetry after every step; drop the key",
    "diagnose_steps": "the failing step's own record names the layers; no steps are "
    "profiled, so drop the key",
    "bfloat16_is_fast": "the device decides: pass hardware= to the callback (float16 goes to "
    "bfloat16 where that device runs bfloat16 fast, else to float32)",
    "min_loss_scale": "the guard lowers the loss scale down to the LossScale floor: pass "
    "loss_scale=autoprec.LossScale(floor=...) to the callback",
    "float8_patience": "a float8 layer saturating on FLOAT8_PATIENCE (2) checks "
    "in a row is promoted; set float8_check_every to check more or less often",
}

#: A float8 layer whose delayed scale lags its amax on this many checks in a row is promoted.
FLOAT8_PATIENCE = 2


class NonFiniteTrainingError(AutoprecError, RuntimeError):
    """Training produced non-finite values and the guard was told to raise."""


@dataclasses.dataclass(frozen=True)
class Guard(ConfigValue):
    """Settings of the runtime guard, which watches training for overflow and promotes the layers where it starts.

    Pass one as `AutoPrecision(plan, guard=autoprec.Guard(...))`; `guard=None`
    turns the guard (and the kernel check) off. A `Guard` is a frozen value:
    build it once, print it, reuse it across callbacks; `get_config()` and
    `Guard.from_config(config)` round-trip it through a plain dict. The guard
    runs on Keras' TensorFlow and JAX backends. Which dtype a layer is promoted
    to follows the callback's `hardware=`, and how low the loss scale may go
    follows its `loss_scale=` (`LossScale.floor`).

    Attributes:
        on_nan: `"promote"` (find the layers and promote them), `"stop"` (stop
            training with a report) or `"raise"` (raise `NonFiniteTrainingError`).
            A non-finite loss with every layer in float32 is reported as a real
            divergence and stops training.
        history_steps: kept so that older configs load; no history is kept (a
            failed step is replayed with amax probes instead).
        near_binades: in the replay of a step that overflowed forward, a float16
            layer whose amax is within this many binades of 65504 is promoted with
            the layers that overflowed.
        check_kernels: before training, run each 16-bit layer once alone; a layer
            whose dtype has no kernel on this device falls back (float16 ->
            bfloat16 -> float32), logged and recorded in `plan.events`.
        float8_check_every: every this many steps, read each float8 layer's scales
            and newest amax (a few scalars on the host); a tensor whose amax has
            outgrown its delayed scale saturates.
            A float8 layer saturating on `FLOAT8_PATIENCE` (2) checks in a row is
            promoted (float8 -> its source dtype, bfloat16 by default).

    Raises:
        AutoprecError: for an `on_nan` other than the three modes, a
            `history_steps` below 1, a `near_binades` that is not positive, or a
            `check_kernels` that is not a bool; the message names the field and
            what it accepts.

    Example:

    ```python
    guard = autoprec.Guard(on_nan="raise", check_kernels=False)
    model.fit(x, y, callbacks=[autoprec.AutoPrecision(plan, guard=guard)])
    ```
    """

    on_nan: str = "promote"
    history_steps: int = 16
    near_binades: float = 2.0
    check_kernels: bool = True
    float8_check_every: int = 10

    def __post_init__(self) -> None:
        every = self.float8_check_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise AutoprecError(
                f"Guard: float8_check_every must be an integer >= 1, got {every!r}."
            )
        if self.on_nan not in ON_NAN_MODES:
            raise AutoprecError(
                f"Guard: on_nan={self.on_nan!r} is not valid; use one of "
                f"{', '.join(repr(mode) for mode in ON_NAN_MODES)}."
            )
        steps = self.history_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise AutoprecError(f"Guard: history_steps must be an integer >= 1, got {steps!r}.")
        binades = self.near_binades
        if isinstance(binades, bool) or not isinstance(binades, (int, float)) or not binades > 0:
            raise AutoprecError(f"Guard: near_binades must be a positive number, got {binades!r}.")
        if not isinstance(self.check_kernels, bool):
            raise AutoprecError(
                f"Guard: check_kernels must be True or False, got {self.check_kernels!r}."
            )

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Guard:
        """Returns the `Guard` that `get_config()` described; a removed field or an unknown key
        raises `AutoprecError` (for a removed one, saying what to write instead)."""
        removed = [name for name in config if name in REMOVED_FIELDS]
        if removed:
            reasons = "; ".join(f"{name!r}: {REMOVED_FIELDS[name]}" for name in removed)
            raise AutoprecError(
                f"Guard.from_config: field(s) {removed} were removed from Guard ({reasons}). "
                f"The fields are {[field.name for field in dataclasses.fields(cls)]}."
            )
        return super().from_config(config)


def check_guard_backend(backend: str, where: str) -> None:
    """Refuses, naming `where`, a guard on a Keras backend other than TensorFlow and JAX."""
    if backend not in GUARD_BACKENDS:
        raise AutoprecError(
            f"{where}: the guard needs Keras' TensorFlow or JAX backend (its in-step telemetry "
            f"runs there), and this Keras runs the {backend!r} backend. Pass guard=None to "
            "train without it (no overflow watch, no kernel check), or set KERAS_BACKEND to "
            "'tensorflow' or 'jax'."
        )


def promotion_target(dtype: str, bfloat16_is_fast: bool, float8_source: str = BFLOAT16) -> str:
    """Returns the dtype a layer that overflows in `dtype` is promoted to: the next wider one
    (float16 -> bfloat16 -> float32; float8 -> its source), bfloat16 only where it runs fast."""
    allowed = (FLOAT32, BFLOAT16) if bfloat16_is_fast else (FLOAT32,)
    if dtype == FLOAT8 and float8_source == FLOAT16:
        allowed = (*allowed, FLOAT16)
    wider = wider_dtypes(dtype, float8_source)
    return widen(wider[0], allowed) if wider else FLOAT32


@dataclasses.dataclass(frozen=True)
class Attribution:
    """Where a failed step's non-finite values came from: `cause` ("data", "forward", "backward",
    "unrecorded" or "elsewhere"), the implicated `layers`, their `evidence` and a `summary`."""

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
        f"{dtype}'s max is {format_max(dtype):.6g})"
    )


def attribute_step(record: StepRecord, dtypes: Mapping[str, str]) -> Attribution:
    """Returns what made a recorded step non-finite: the input batch, then 16-bit layers out of
    range forward (finite inputs first), then backward, then the 16-bit layers left unrecorded."""
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
            f"{format_max(dtypes[path]):.6g})"
            for path in backward
        }
        return Attribution(
            "backward",
            tuple(backward),
            evidence,
            f"gradients left the 16-bit range in {', '.join(backward)} at loss scale "
            f"{record.loss_scale:g}",
        )
    unseen = [path for path in record.unrecorded if dtypes.get(path, FLOAT32) != FLOAT32]
    if unseen:
        evidence = {path: f"{dtypes[path]}; its values could not be recorded" for path in unseen}
        return Attribution(
            "unrecorded",
            tuple(unseen),
            evidence,
            f"no recorded 16-bit layer shows it; {', '.join(unseen)} could not be recorded",
        )
    return Attribution(
        "elsewhere",
        summary="non-finite gradients outside the 16-bit layers (a float32 layer or the loss)",
    )


def lowered_loss_scale(scale: float, failures_in_a_row: int, minimum: float) -> float:
    """Returns the loss scale after gradients overflowed `failures_in_a_row` steps running: 1, 2,
    4, then 8 binades lower per failed step, never below `minimum`."""
    binades = min(8, 2 ** max(0, failures_in_a_row - 1))
    return max(float(minimum), float(scale) / 2.0**binades)


class GuardAction(enum.Enum):
    """What the callback does about a step (see `decide`)."""

    NONE = "none"  # nothing to do
    LOWER_SCALE = "lower_scale"  # gradients overflowed: the dynamic loss scale is lowered
    PROMOTE = "promote"  # promote `GuardDecision.layers`
    SKIP = "skip"  # not a precision problem: the update was skipped, nothing promoted
    STOP = "stop"  # stop training with the report
    RAISE = "raise"  # raise `NonFiniteTrainingError` with the report


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    """What the host learnt about one train step (`attribution` is `None` for a finite step)."""

    step: int
    attribution: Attribution | None = None
    loss_scale: float = 1.0
    loss_finite: bool = True
    has_16bit_layers: bool = True


@dataclasses.dataclass(frozen=True)
class GuardDecision:
    """What to do about a step, as plain values."""

    action: GuardAction = GuardAction.NONE
    layers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    loss_scale: float | None = None
    failures_in_a_row: int = 0
    trigger: str = ""
    events: tuple[Mapping[str, object], ...] = ()
    lines: tuple[str, ...] = ()


def decide(
    outcome: StepOutcome,
    *,
    on_nan: str,
    dynamic_scale: bool,
    floor: float,
    failures_in_a_row: int = 0,
) -> GuardDecision:
    """Returns what the guard does about one step, from plain values: skip a step the data or a
    float32 part broke, lower a dynamic loss scale, else promote, stop or raise as `on_nan` says."""
    if on_nan not in ON_NAN_MODES:
        raise ValueError(f"on_nan must be one of {ON_NAN_MODES}, got {on_nan!r}.")
    attribution = outcome.attribution
    if attribution is None:
        return _decide_finite_step(outcome, on_nan)
    summary = f"non-finite step {outcome.step}: {attribution.summary}"
    if attribution.cause in ("data", "elsewhere"):
        return _decide_not_precision(outcome, summary, on_nan, dynamic_scale, failures_in_a_row)
    if attribution.cause == "backward" and dynamic_scale and outcome.loss_scale > floor:
        failures = failures_in_a_row + 1
        scale = lowered_loss_scale(outcome.loss_scale, failures, floor)
        line = (
            f"autoprec guard: step {outcome.step}: loss scale {outcome.loss_scale:g} -> {scale:g}"
        )
        return GuardDecision(
            GuardAction.LOWER_SCALE, loss_scale=scale, failures_in_a_row=failures, lines=(line,)
        )
    if on_nan == "raise":
        return GuardDecision(GuardAction.RAISE, lines=(f"autoprec guard: {summary}.",))
    if on_nan == "stop":
        return _stop(outcome.step, summary, "on_nan='stop'")
    restored = (
        outcome.loss_scale if attribution.cause == "forward" else max(floor, outcome.loss_scale)
    )
    return GuardDecision(
        GuardAction.PROMOTE,
        layers=dict(attribution.evidence),
        loss_scale=restored if dynamic_scale else None,
        trigger=summary,
    )


def _decide_finite_step(outcome: StepOutcome, on_nan: str) -> GuardDecision:
    """A step without a failed record: nothing, or a divergence in float32."""
    if outcome.loss_finite or outcome.has_16bit_layers:
        return GuardDecision()
    trigger = f"non-finite loss at step {outcome.step}"
    why = "every layer computes in float32: this is a training divergence, not a precision problem"
    decision = _stop(outcome.step, trigger, why)
    if on_nan == "raise":
        return dataclasses.replace(decision, action=GuardAction.RAISE)
    return decision


def _decide_not_precision(
    outcome: StepOutcome, summary: str, on_nan: str, dynamic_scale: bool, failures_in_a_row: int
) -> GuardDecision:
    """A failed step the input data or a float32 part caused: recorded, nothing promoted."""
    event = {"step": outcome.step, "kind": "not_precision", "evidence": outcome.attribution.summary}
    if on_nan == "stop":
        decision = _stop(outcome.step, summary, "on_nan='stop'")
    else:
        raising = on_nan == "raise"
        ending = "Nothing promoted." if raising else "Not a precision problem: nothing promoted."
        line = f"autoprec guard: {summary}; update skipped. {ending}"
        decision = GuardDecision(GuardAction.RAISE if raising else GuardAction.SKIP, lines=(line,))
    return dataclasses.replace(
        decision,
        loss_scale=outcome.loss_scale if dynamic_scale else None,  # not the scale's fault
        failures_in_a_row=failures_in_a_row,
        events=(event, *decision.events),
    )


def _stop(step: int, trigger: str, why: str) -> GuardDecision:
    """Stops training: one `"stopped"` event and one line."""
    return GuardDecision(
        GuardAction.STOP,
        trigger=trigger,
        events=({"step": step, "kind": "stopped", "evidence": trigger},),
        lines=(f"autoprec guard: {trigger}; {why}. Training stopped.",),
    )


class GuardWatch:
    """The guard's state between steps of a `fit`: its telemetry, its failed steps, its stop."""

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
        """Returns what happened in the step `step`, or `None` when there is nothing to act on: a
        step the optimizer skipped is replayed with amax probes and attributed."""
        if self.stopped:
            return None
        telemetry = self.telemetry
        if telemetry is None:
            loss = (logs or {}).get("loss", 0.0)
            if is_finite_number(loss):
                return None
            has_16bit = any(dtype != FLOAT32 for dtype in dtypes.values())
            return StepOutcome(step, loss_finite=False, has_16bit_layers=has_16bit)
        if not float((logs or {}).get(SKIPPED_STEPS, 1)):
            return None  # no step skipped this epoch: nothing to read from the device
        record = telemetry.failed_step(dtypes)
        if record is None:
            return None
        if step != self.last_failed_index + 1:
            self.failures_in_a_row = 0
        self.last_failed_index = step
        attribution = attribute_step(record, dtypes)
        if attribution.cause == "forward":
            near = near_range_layers(record, dtypes, near_binades)
            evidence = {**attribution.evidence, **near}
            attribution = dataclasses.replace(
                attribution, layers=tuple(evidence), evidence=evidence
            )
        return StepOutcome(step, attribution=attribution, loss_scale=record.loss_scale)


def is_finite_number(value: object) -> bool:
    """Returns whether a logged value is a finite number (non-numbers count as finite)."""
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True
