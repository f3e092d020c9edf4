"""Tests for autoprec.profiler.views: TensorBoard histograms and the heat map of a profile."""

from __future__ import annotations

import pytest
from profiler.reference import synthetic_profile

from autoprec._backends import tensorflow as tf_backend


def test_tensorboard_and_plot_outputs(tmp_path):
    prof = synthetic_profile()
    prof.to_tensorboard(tmp_path / "logs")
    written = tf_backend.read_histograms(tmp_path / "logs")
    assert "attention/internals/attention_logits" in written
    buckets = written["encoder/dense/activations"]
    assert buckets[:, 2].sum() == 3  # three non-zero activations
    assert buckets[0, 0] == -1 and buckets[-1, 0] == 1  # exponents of 0.5 and 3.0
    pytest.importorskip("matplotlib")
    image = prof.plot(tmp_path / "ranges.png")
    assert image.stat().st_size > 1000
