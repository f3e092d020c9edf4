"""What the guard does about one step: a pure function from plain values to a frozen decision."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from .guard import ON_NAN_MODES, Attribution, lowered_loss_scale


class GuardAction(enum.Enum):
    """What the callback does about a step (see `decide`)."""

    NONE = "none"  # nothing to do
    LOWER_SCALE = "lower_scale"  # gradients overflowed: the dynamic loss scale is lowered
    PROMOTE = "promote"  # promote `GuardDecision.layers`
    SKIP = "skip"  # not a precision problem: the update was skipped, nothing promoted
    WARN = "warn"  # float16 layers climb toward 65504 and on_nan does not promote: report them
    STOP = "stop"  # stop training with the report
    RAISE = "raise"  # raise `NonFiniteTrainingError` with the report


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    """What the host learnt about one train step.

    Attributes:
        step: the step's number in this callback's count (1 for the first).
        attribution: for a step whose values were not finite, what made them so
            (`attribute_step`); `None` for a finite step.
        loss_scale: the loss scale the failing step ran with.
        climbing: `{path: evidence}` of float16 layers whose amax history
            climbs toward 65504 (`climbing_layers`), for a finite step.
        loss_finite: whether the step's logged loss was finite.
        has_16bit_layers: whether any layer computes in float16 or bfloat16
            (the telemetry watches those; without any, a non-finite loss is a
            training divergence).
    """

    step: int
    attribution: Attribution | None = None
    loss_scale: float = 1.0
    climbing: Mapping[str, str] = dataclasses.field(default_factory=dict)
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
    """Returns what the guard does about one step, from plain values (no Keras object).

    A finite step does nothing, or promotes (`on_nan="promote"`) or reports the
    float16 layers climbing toward 65504. A failed step the data or a float32
    part caused is skipped and reported, its halved loss scale restored. A step
    whose gradients overflowed lowers a dynamic loss scale by 1, 2, 4, then 8
    binades per failed step in a row, down to `floor`. Otherwise `on_nan`
    decides: promote the implicated layers, stop, or raise. A non-finite loss
    with no 16-bit layer is a training divergence: training stops (or raises).

    Args:
        outcome: the step, a `StepOutcome`.
        on_nan: `"promote"`, `"stop"` or `"raise"` (`Guard.on_nan`).
        dynamic_scale: whether the optimizer scales the loss with a dynamic scale
            the guard may set.
        floor: the lowest loss scale (`LossScale.floor`; 1 where there is none).
        failures_in_a_row: the previous decision's `failures_in_a_row` when the
            step before this one also failed, else 0.

    Returns:
        A `GuardDecision`.

    Raises:
        ValueError: for an `on_nan` that is not one of the three modes.

    Example:

    ```python
    decision = decide(StepOutcome(12, attribution, loss_scale=32768.0),
                      on_nan="promote", dynamic_scale=True, floor=1.0)
    decision.action, decision.layers  # GuardAction.PROMOTE, {"big": "non-finite float16 ..."}
    ```
    """
    if on_nan not in ON_NAN_MODES:
        raise ValueError(f"on_nan must be one of {ON_NAN_MODES}, got {on_nan!r}.")
    attribution = outcome.attribution
    if attribution is None:
        return _decide_finite_step(outcome, on_nan)
    summary = f"non-finite step {outcome.step}: {attribution.summary}"
    if attribution.cause in ("data", "elsewhere"):
        return _decide_not_precision(outcome, on_nan, dynamic_scale, failures_in_a_row)
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
    """A step without a failed record: the climbing layers, or a divergence in float32."""
    if not outcome.loss_finite and not outcome.has_16bit_layers:
        trigger = f"non-finite loss at step {outcome.step}"
        why = "every layer computes in float32: this is a training divergence, not a precision problem"
        decision = _stop(outcome.step, trigger, why)
        if on_nan == "raise":
            return dataclasses.replace(decision, action=GuardAction.RAISE)
        return decision
    if not outcome.climbing:
        return GuardDecision()
    if on_nan != "promote":
        lines = tuple(
            f"autoprec guard: step {outcome.step}: {path}: {evidence}"
            for path, evidence in outcome.climbing.items()
        )
        return GuardDecision(GuardAction.WARN, layers=dict(outcome.climbing), lines=lines)
    return GuardDecision(
        GuardAction.PROMOTE,
        layers=dict(outcome.climbing),
        trigger=f"amax near float16's range at step {outcome.step}",
    )


def _decide_not_precision(
    outcome: StepOutcome, on_nan: str, dynamic_scale: bool, failures_in_a_row: int
) -> GuardDecision:
    """A failed step the input data or a float32 part caused: recorded, nothing promoted."""
    summary = outcome.attribution.summary
    line = f"autoprec guard: non-finite step {outcome.step}: {summary}; update skipped."
    event = {"step": outcome.step, "kind": "not_precision", "evidence": summary}
    restored = outcome.loss_scale if dynamic_scale else None  # not the scale's fault
    if on_nan == "stop":
        stop = _stop(outcome.step, f"non-finite step {outcome.step}: {summary}", "on_nan='stop'")
        return dataclasses.replace(
            stop,
            loss_scale=restored,
            failures_in_a_row=failures_in_a_row,
            events=(event, *stop.events),
        )
    action, ending = (
        (GuardAction.RAISE, " Nothing promoted.")
        if on_nan == "raise"
        else (GuardAction.SKIP, " Not a precision problem: nothing promoted.")
    )
    return GuardDecision(
        action,
        loss_scale=restored,
        failures_in_a_row=failures_in_a_row,
        events=(event,),
        lines=(line + ending,),
    )


def _stop(step: int, trigger: str, why: str) -> GuardDecision:
    """Stops training: one `"stopped"` event and one line."""
    return GuardDecision(
        GuardAction.STOP,
        trigger=trigger,
        events=({"step": step, "kind": "stopped", "evidence": trigger},),
        lines=(f"autoprec guard: {trigger}; {why}. Training stopped.",),
    )
