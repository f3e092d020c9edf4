"""Tests for autoprec.runtime.telemetry: record types, format limits, a batch's amax."""

from __future__ import annotations

import math

import numpy as np

from autoprec import numerics
from autoprec.runtime.telemetry import (
    FORMAT_MAX,
    NOT_RECORDED,
    LayerAmax,
    StepRecord,
    batch_amax,
    format_max,
    is_out_of_range,
)


def test_format_limits_come_from_numerics():
    for name in ("float16", "bfloat16", "float32"):
        assert FORMAT_MAX[name] == numerics.float_format(name).max == format_max(name)
    assert format_max("int8") == numerics.FLOAT32.max
    assert is_out_of_range(7e4, "float16") and not is_out_of_range(7e4, "bfloat16")
    assert is_out_of_range(math.nan, "float32") and not is_out_of_range(NOT_RECORDED, "float16")


def test_records_say_whether_a_step_was_finite():
    record = StepRecord(7, 1024.0, 2.5, True, {"a": LayerAmax(), "b": LayerAmax(100.0, 3.0, 4e3)})
    assert record.batch_finite and record.finite and record.layers["b"].forward == 4e3
    infinite = StepRecord(7, 1024.0, 2.5, True, {"b": LayerAmax(gradient=math.inf)})
    assert not infinite.finite  # b's gradient is infinite
    assert LayerAmax(output=math.nan).forward != LayerAmax(output=math.nan).forward  # NaN
    assert StepRecord(1, 1.0, math.inf, True, {}).finite is False


def test_a_batchs_amax_keeps_nan_and_skips_integer_arrays():
    x = np.array([[1.0, -3.0], [2.0, 0.5]], np.float32)
    labels = np.array([7, 9], np.int64)
    assert batch_amax((x, labels, None)) == 3.0
    x[0, 0] = np.nan
    assert math.isnan(batch_amax((x, labels)))
    assert batch_amax((labels,)) == 0.0
