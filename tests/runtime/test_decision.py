"""The guard's step decision, branch by branch, from plain values (autoprec/runtime/guard.py)."""

from __future__ import annotations

import pytest

from autoprec.runtime.guard import Attribution, GuardAction, GuardDecision, StepOutcome, decide

FORWARD = Attribution(
    "forward",
    ("big",),
    {"big": "non-finite float16 outputs (amax inf; inputs amax 1000; float16's max is 65504)"},
    "big: non-finite float16 outputs",
)
BACKWARD = Attribution(
    "backward",
    ("b", "a"),
    {"b": "float16 gradients amax inf", "a": "float16 gradients amax 7e+04"},
    "gradients left the 16-bit range in b, a at loss scale 32768",
)
DATA = Attribution("data", summary="NaN entered with the input data")
ELSEWHERE = Attribution("elsewhere", summary="non-finite gradients outside the 16-bit layers")


def _decide(outcome, on_nan="promote", dynamic_scale=True, floor=1.0, failures_in_a_row=0):
    return decide(
        outcome,
        on_nan=on_nan,
        dynamic_scale=dynamic_scale,
        floor=floor,
        failures_in_a_row=failures_in_a_row,
    )


def test_a_finite_step_changes_nothing():
    decision = _decide(StepOutcome(5))
    assert decision == GuardDecision()
    assert decision.action is GuardAction.NONE and not decision.events


def test_forward_overflow_promotes_every_implicated_layer_and_keeps_the_scale():
    decision = _decide(StepOutcome(11, FORWARD, loss_scale=16384.0))
    assert decision.action is GuardAction.PROMOTE
    assert dict(decision.layers) == dict(FORWARD.evidence)
    assert decision.loss_scale == 16384.0  # the scale the step ran with: its halving undone
    assert decision.trigger == "non-finite step 11: big: non-finite float16 outputs"
    assert not decision.events  # the promotions are the events, built where the dtypes are known


def test_forward_overflow_without_a_dynamic_scale_leaves_the_scale_alone():
    decision = _decide(StepOutcome(3, FORWARD, loss_scale=1.0), dynamic_scale=False)
    assert decision.action is GuardAction.PROMOTE and decision.loss_scale is None


@pytest.mark.parametrize(
    ("failures", "expected"), [(0, 16384.0), (1, 8192.0), (2, 2048.0), (3, 128.0), (9, 128.0)]
)
def test_backward_overflow_lowers_the_scale_faster_each_failed_step_in_a_row(failures, expected):
    decision = _decide(StepOutcome(4, BACKWARD, loss_scale=32768.0), failures_in_a_row=failures)
    assert decision.action is GuardAction.LOWER_SCALE
    assert decision.loss_scale == expected
    assert decision.failures_in_a_row == failures + 1
    assert decision.lines == (f"autoprec guard: step 4: loss scale 32768 -> {expected:g}",)


def test_backward_overflow_never_lowers_the_scale_below_the_floor():
    decision = _decide(StepOutcome(4, BACKWARD, loss_scale=4.0), floor=2.0, failures_in_a_row=3)
    assert decision.action is GuardAction.LOWER_SCALE and decision.loss_scale == 2.0
    below = _decide(
        StepOutcome(4, BACKWARD, loss_scale=2.0**-8), floor=2.0**-10, failures_in_a_row=3
    )
    assert below.loss_scale == 2.0**-10  # a floor below 1 lets it go below 1


def test_backward_overflow_at_the_floor_promotes_the_layers_the_gradients_left_range_in():
    decision = _decide(StepOutcome(9, BACKWARD, loss_scale=1.0), floor=1.0, failures_in_a_row=4)
    assert decision.action is GuardAction.PROMOTE
    assert list(decision.layers) == ["b", "a"]  # backward order
    assert decision.loss_scale == 1.0  # at least the floor
    assert decision.failures_in_a_row == 0


def test_backward_overflow_with_a_fixed_scale_promotes_at_once():
    decision = _decide(StepOutcome(2, BACKWARD, loss_scale=128.0), dynamic_scale=False)
    assert decision.action is GuardAction.PROMOTE and decision.loss_scale is None


@pytest.mark.parametrize("attribution", [FORWARD, BACKWARD])
def test_on_nan_stop_and_raise_for_a_precision_problem(attribution):
    stop = _decide(StepOutcome(7, attribution, loss_scale=1.0), on_nan="stop")
    summary = f"non-finite step 7: {attribution.summary}"
    assert stop.action is GuardAction.STOP
    assert stop.events == ({"step": 7, "kind": "stopped", "evidence": summary},)
    assert stop.lines == (f"autoprec guard: {summary}; on_nan='stop'. Training stopped.",)
    raised = _decide(StepOutcome(7, attribution, loss_scale=1.0), on_nan="raise")
    assert raised.action is GuardAction.RAISE and not raised.events
    assert raised.lines == (f"autoprec guard: {summary}.",)


@pytest.mark.parametrize("attribution", [DATA, ELSEWHERE])
def test_a_step_the_data_or_a_float32_part_broke_is_skipped_and_reported(attribution):
    decision = _decide(StepOutcome(6, attribution, loss_scale=32768.0), failures_in_a_row=2)
    assert decision.action is GuardAction.SKIP and not decision.layers
    assert decision.loss_scale == 32768.0  # not the scale's fault: its halving undone
    assert decision.failures_in_a_row == 2
    assert decision.events == (
        {"step": 6, "kind": "not_precision", "evidence": attribution.summary},
    )
    assert decision.lines[0].endswith("update skipped. Not a precision problem: nothing promoted.")


def test_a_data_fault_under_stop_records_both_events_and_under_raise_says_nothing_promoted():
    stop = _decide(StepOutcome(6, DATA, loss_scale=8.0), on_nan="stop")
    assert stop.action is GuardAction.STOP and stop.loss_scale == 8.0
    assert [event["kind"] for event in stop.events] == ["not_precision", "stopped"]
    raised = _decide(StepOutcome(6, DATA, loss_scale=8.0), on_nan="raise", dynamic_scale=False)
    assert raised.action is GuardAction.RAISE and raised.loss_scale is None
    assert [event["kind"] for event in raised.events] == ["not_precision"]
    assert raised.lines == (
        "autoprec guard: non-finite step 6: NaN entered with the input data; update skipped. "
        "Nothing promoted.",
    )


def test_a_non_finite_loss_with_every_layer_in_float32_is_a_divergence():
    outcome = StepOutcome(13, loss_finite=False, has_16bit_layers=False)
    stop = _decide(outcome)
    assert stop.action is GuardAction.STOP
    assert stop.events == (
        {"step": 13, "kind": "stopped", "evidence": "non-finite loss at step 13"},
    )
    assert "a training divergence, not a precision problem. Training stopped." in stop.lines[0]
    raised = _decide(outcome, on_nan="raise")
    assert raised.action is GuardAction.RAISE and raised.events == stop.events
    # With 16-bit layers the telemetry's record of the step decides, not the loss.
    assert _decide(StepOutcome(13, loss_finite=False)).action is GuardAction.NONE


def test_an_unknown_on_nan_is_refused():
    with pytest.raises(ValueError, match="on_nan must be one of"):
        _decide(StepOutcome(1), on_nan="ignore")
