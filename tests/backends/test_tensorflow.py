"""Tests for autoprec._backends.tensorflow: tensor statistics, variable names, TensorBoard files.

The probes inside real training steps are tested with the profiler
(`tests/profiler/test_probes.py`, `test_stats.py`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from autoprec._backends import profiler_backend
from autoprec._backends import tensorflow as tf_backend


def test_the_profiler_backend_on_tensorflow_is_this_module():
    assert profiler_backend() is tf_backend


def test_variable_names_keep_safe_characters_only():
    assert tf_backend.variable_name("block/dense 1", "tensor") == "block_dense_1"
    assert tf_backend.variable_name("x" * 200, "tensor") == "x" * 120
    assert tf_backend.variable_name("", "tensor") == "tensor"


def test_tensor_statistics_count_exponents_zeros_and_non_finite_values():
    values = tf.constant([0.0, 1.0, -3.0, np.inf, np.nan, 0.25], tf.float32)
    counts, floats = (array.numpy() for array in tf_backend.tensor_statistics(values))
    assert counts.shape == (tf_backend.RAW_COUNT_SLOTS,) and counts[:-1].sum() == 6
    assert counts[0] == 1  # the zero
    assert counts[125] == counts[127] == counts[128] == 1  # 0.25, 1.0, 3.0 by exponent
    assert counts[255] == 2 and counts[-1] == 1  # inf and NaN; one of them NaN
    max_abs, min_nonzero, sum_abs, _ = floats
    assert max_abs == 3.0 and min_nonzero == 0.25 and sum_abs == 4.25


def test_histograms_written_are_read_back(tmp_path):
    exponents, counts = np.array([-2, 0, 3]), np.array([1, 5, 2])
    tf_backend.write_histograms(tmp_path, [("layer/output", exponents, counts)], step=1)
    (buckets,) = tf_backend.read_histograms(tmp_path).values()
    assert buckets[:, 0].tolist() == [-2, 0, 3] and buckets[:, 1].tolist() == [-1, 1, 4]
    assert buckets[:, 2].tolist() == [1, 5, 2]


def test_summary_writer_writes_an_event_file(tmp_path):
    writer = tf_backend.SummaryWriter(tmp_path / "guard")
    writer.write(3, {"loss_scale": 1024.0}, {"plan": "**dense**: float16"})
    writer.close()
    assert list((tmp_path / "guard").glob("events.out.tfevents.*"))
