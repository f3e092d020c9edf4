"""Tests for autoprec.runtime.telemetry: frame layout, record types, format limits."""

from __future__ import annotations

import math

import numpy as np
from keras import ops

from autoprec import numerics
from autoprec.runtime.telemetry import (
    FORMAT_MAX,
    GRADIENT,
    HEADER_GRADIENTS_BAD,
    INTERNAL,
    NOT_RECORDED,
    NOT_RECORDED_BITS,
    OUTPUT,
    SLOTS,
    LayerAmax,
    StepRecord,
    TelemetryStatus,
    format_max,
    frame_segment,
    is_out_of_range,
    status_flags,
    step_record,
)


def test_format_limits_come_from_numerics():
    for name in ("float16", "bfloat16", "float32"):
        assert FORMAT_MAX[name] == numerics.float_format(name).max == format_max(name)
    assert format_max("int8") == numerics.FLOAT32.max
    assert is_out_of_range(7e4, "float16") and not is_out_of_range(7e4, "bfloat16")
    assert is_out_of_range(math.nan, "float32") and not is_out_of_range(NOT_RECORDED, "float16")


def test_frame_layout():
    assert SLOTS == ("output", "input", "internal", "gradient")
    assert frame_segment(0, OUTPUT) == 4 and frame_segment(2, GRADIENT) == 15
    assert np.array(NOT_RECORDED_BITS, np.int32).view(np.float32) == NOT_RECORDED


def test_records_read_from_a_frame():
    frame = np.full((3, 4), NOT_RECORDED, np.float32)
    frame[0, :3] = (1024.0, 2.5, 0.0)
    frame[2] = (100.0, 3.0, 4e3, np.inf)
    record = step_record(frame, 7, ["a", "b"])
    assert record.index == 7 and record.loss_scale == 1024.0 and record.batch_finite
    assert record.layers["a"] == LayerAmax() and record.layers["b"].internal == 4e3
    assert record.layers["b"].forward == 4e3 and record.gradients_finite
    assert not record.finite  # b's gradient is infinite
    assert LayerAmax(output=math.nan).forward != LayerAmax(output=math.nan).forward  # NaN
    assert StepRecord(1, 1.0, math.inf, True, {}).finite is False


def test_status_flags_agree_in_graph_and_on_the_host():
    history = np.full((3, 3, 4), NOT_RECORDED, np.float32)
    history[:, 1, OUTPUT] = 1e4
    frame = np.full((3, 4), NOT_RECORDED, np.float32)
    frame[0, :3] = (1.0, 1.0, 0.0)
    frame[1, INTERNAL] = 2e4  # a float16 layer's new record, within 2 binades of 65504
    frame[2, OUTPUT] = 5e4  # a bfloat16 layer: no warning
    float16 = np.array([True, False])
    for xp in (np, ops):
        failed, near = status_flags(frame, history, float16, 65504 / 4, xp)
        assert not bool(failed) and bool(near)
    frame[0, HEADER_GRADIENTS_BAD] = 1.0
    failed, near = status_flags(frame, history, np.array([False, False]), 65504 / 4, np)
    assert bool(failed) and not bool(near)
    assert not TelemetryStatus() and TelemetryStatus(near_range=True)
