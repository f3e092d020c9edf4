"""Tests for autoprec.runtime.telemetry: a traced step's amax bits and the frame they make."""

from __future__ import annotations

import numpy as np
from keras import ops

from autoprec._backends.instrument import amax_bits
from autoprec.runtime.telemetry import (
    GRADIENT,
    INPUT,
    NOT_RECORDED,
    OUTPUT,
    StepTrace,
    active_trace,
    build_frame,
    close_trace,
    open_trace,
)


def _tensor(values, dtype="float32"):
    return ops.cast(ops.convert_to_tensor(np.array(values, np.float32)), dtype)


def test_a_tensor_is_measured_once_per_step():
    trace = StepTrace(True)
    tensor = _tensor([1.0, -8.0], "float16")
    first = trace.amax(tensor)
    assert trace.amax(tensor) is first and trace.known(tensor) is first
    trace.forget()
    assert trace.known(tensor) is None


def test_the_frame_holds_the_largest_value_of_each_slot():
    batch = [amax_bits(_tensor([3.0, -4.0]))]
    trace = StepTrace(True, batch=batch)
    trace.add(0, OUTPUT, amax_bits(_tensor([2.0], "float16")))
    trace.add(0, OUTPUT, amax_bits(_tensor([-6.0], "float16")))
    trace.all_gradients.append(amax_bits(_tensor([np.inf])))
    trace.add(1, GRADIENT, amax_bits(_tensor([0.5], "bfloat16")))
    frame = ops.convert_to_numpy(build_frame(trace, 3, ops.convert_to_tensor(256.0)))
    assert frame[0].tolist() == [256.0, 4.0, 1.0, NOT_RECORDED]  # a gradient was non-finite
    assert frame[1].tolist() == [6.0, NOT_RECORDED, NOT_RECORDED, NOT_RECORDED]
    assert frame[2, GRADIENT] == 0.5


def test_lazy_slots_are_measured_only_when_the_step_fails():
    lazy_tensor = _tensor([7.0, -9.0], "bfloat16")
    for gradient, expected in ((1.0, NOT_RECORDED), (np.nan, 9.0)):
        trace = StepTrace(True)
        trace.all_gradients.append(amax_bits(_tensor([gradient])))
        trace.add_lazy(0, INPUT, trace.lazy_parts(lazy_tensor))
        frame = ops.convert_to_numpy(build_frame(trace, 2, ops.convert_to_tensor(1.0)))
        assert frame[1, INPUT] == expected
        assert frame[0, 1] == 0.0  # no float inputs in the batch


def test_values_taken_out_of_a_function_keep_their_segments():
    trace = StepTrace(True)
    tensor = _tensor([5.0])
    trace.add(1, OUTPUT, trace.amax(tensor))
    packed, segments = trace.take_values()
    assert segments == [8] and not trace.values and trace.known(tensor) is None
    frame = build_frame(StepTrace(True), 3, ops.convert_to_tensor(1.0), (packed, segments))
    assert ops.convert_to_numpy(frame)[2, OUTPUT] == 5.0


def test_the_trace_is_open_in_this_thread_only_between_open_and_close():
    trace = StepTrace(True)
    assert active_trace() is None
    open_trace(trace)
    try:
        assert active_trace() is trace
    finally:
        close_trace()
    assert active_trace() is None
