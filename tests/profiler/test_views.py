"""Tests for autoprec.profiler.views: TensorBoard histograms and the heat map of a profile."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from profiler.reference import synthetic_profile
from tensorflow.core.util import event_pb2

from autoprec import numerics
from autoprec.profiler.views import format_fraction, format_scale, heat_map, summary_table


def test_tensorboard_and_plot_outputs(tmp_path):
    prof = synthetic_profile()
    prof.to_tensorboard(tmp_path / "logs")
    written = {
        value.tag: tf.make_ndarray(value.tensor)
        for path in (tmp_path / "logs").glob("events.out.tfevents.*")
        for record in tf.data.TFRecordDataset(str(path))
        for value in event_pb2.Event.FromString(record.numpy()).summary.value
    }
    assert "attention/internals/attention_logits" in written
    buckets = written["encoder/dense/activations"]
    assert buckets[:, 2].sum() == 3  # three non-zero activations
    assert buckets[0, 0] == -1 and buckets[-1, 0] == 1  # exponents of 0.5 and 3.0
    pytest.importorskip("matplotlib")
    image = prof.plot(tmp_path / "ranges.png")
    assert image.stat().st_size > 1000


def _row(path: str, safe: bool, exceeds: bool = False, overflow: float = 0.0) -> Any:
    """A stand-in for a `LayerProfile` with the figures the table reads."""
    return types.SimpleNamespace(
        path=path,
        class_name="Dense",
        forward=types.SimpleNamespace(max_abs=1e5 if exceeds else 2.0),
        float16_overflow_fraction=overflow,
        float16_exceeds_max=exceeds,
        float16_underflow_fraction=0.0,
        bfloat16_underflow_fraction=0.0,
        gradient=None if safe else types.SimpleNamespace(max_abs=0.5),
        suggested_loss_scale=None if safe else 2.0**10,
        gradient_underflow_fraction=0.0,
        float16_headroom_bits=3.0,
        float16_safe=safe,
        float8=None,
    )


def test_summary_table_puts_the_riskiest_layers_first():
    rows = [
        _row("safe", True),
        _row("over", False, exceeds=True, overflow=0.25),
        _row("odd", False),
    ]
    lines = summary_table("demo", 7, 2.0**10, rows).splitlines()
    assert lines[0] == "Profile of demo: 7 steps, 3 layers, float16 loss scale 2^10"
    assert lines[1].split() == [
        "layer",
        "class",
        "max|x|",
        "f16",
        "ovf",
        "f16",
        "ftz",
        "bf16",
        "ftz",
        "max|g|",
        "loss",
        "scale",
        "g",
        "ftz@scale",
        "f16",
        "safe",
    ]
    assert set(lines[2]) == {"-", " "}
    assert [line.split()[0] for line in lines[3:]] == ["over", "odd", "safe"]
    assert "25.00%!" in lines[3] and lines[3].endswith("NO") and lines[5].endswith("yes")
    assert lines[5].split()[6:9] == ["-", "-", "-"]  # no gradient: no scale, no flush to zero
    short = summary_table("", 1, None, rows, max_rows=1).splitlines()
    assert short[0] == "Profile of model: 1 steps, 3 layers, float16 loss scale -"
    assert len(short) == 4


def test_fractions_and_scales_are_formatted_briefly():
    assert format_fraction(0.0) == "0"
    assert format_fraction(0.125) == "12.50%"
    assert format_fraction(3e-6) == "3.0e-06"
    assert format_scale(None) == "-" and format_scale(2.0**15) == "2^15"


def test_heat_map_writes_an_image(tmp_path):
    pytest.importorskip("matplotlib")
    fractions = np.zeros((2, numerics.HISTOGRAM_BINS))
    fractions[0, 149] = 1.0  # every value in [1, 2)
    fractions[1, 170] = 0.5
    image = heat_map(tmp_path / "map.png", ["a", "b"], [("forward values", fractions)])
    assert image == tmp_path / "map.png" and image.stat().st_size > 1000
