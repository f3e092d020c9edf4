"""Tests for autoprec._backends.tensorflow: histograms, scalars and text as event files.

Each event file written is read back record by record with TensorFlow's own
`Event` parser, so what TensorBoard would show is what is checked.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.core.util import event_pb2

from autoprec._backends import tensorflow as tf_backend
from autoprec._backends import tensorflow as tensorboard


def _summaries(logdir) -> list[tuple[int, str, str, str, np.ndarray]]:
    """`(step, tag, plugin, description, value)` of every summary value under `logdir`."""
    found = []
    for path in sorted(tf.io.gfile.glob(str(logdir / "events.out.tfevents.*"))):
        for record in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                metadata = value.metadata
                found.append(
                    (
                        event.step,
                        value.tag,
                        metadata.plugin_data.plugin_name,
                        metadata.summary_description,
                        tf.make_ndarray(value.tensor),
                    )
                )
    return found


def test_histograms_written_are_read_back(tmp_path):
    exponents, counts = np.array([-2, 0, 3]), np.array([1, 5, 2])
    tensorboard.write_histograms(tmp_path, [("layer/output", exponents, counts)], step=1)
    (buckets,) = tensorboard.read_histograms(tmp_path).values()
    assert buckets[:, 0].tolist() == [-2, 0, 3] and buckets[:, 1].tolist() == [-1, 1, 4]
    assert buckets[:, 2].tolist() == [1, 5, 2]


def test_histograms_carry_their_step_plugin_and_description(tmp_path):
    series = [("a/output", np.array([0]), np.array([4])), ("b/output", np.array([7]), [1])]
    tensorboard.write_histograms(tmp_path, series, step=5, description=lambda tag: f"of {tag}")
    summaries = _summaries(tmp_path)
    assert [(step, tag, plugin, text) for step, tag, plugin, text, _ in summaries] == [
        (5, "a/output", "histograms", "of a/output"),
        (5, "b/output", "histograms", "of b/output"),
    ]
    assert sorted(tensorboard.read_histograms(tmp_path)) == ["a/output", "b/output"]


def test_the_profilers_tensorflow_module_writes_with_this_writer():
    assert tf_backend.write_histograms is tensorboard.write_histograms


def test_summary_writer_writes_scalars_and_markdown_text(tmp_path):
    writer = tensorboard.SummaryWriter(tmp_path / "guard")
    writer.write(3, {"loss_scale": 1024.0}, {"plan": "**dense**: float16"})
    writer.write(4, {"loss_scale": 512.0}, {})
    writer.close()
    written = {
        (step, tag, plugin): value for step, tag, plugin, _, value in _summaries(tmp_path / "guard")
    }
    assert set(written) == {
        (3, "loss_scale", "scalars"),
        (3, "plan", "text"),
        (4, "loss_scale", "scalars"),
    }
    assert float(written[(3, "loss_scale", "scalars")]) == 1024.0
    assert float(written[(4, "loss_scale", "scalars")]) == 512.0
    assert written[(3, "plan", "text")].item() == b"**dense**: float16"
    assert tensorboard.read_histograms(tmp_path / "guard") == {}  # no histogram among them


def test_a_histogram_series_is_what_the_writers_take(tmp_path):
    series = [("dense/output", np.array([-1, 2]), np.array([3, 4]))]
    tf_backend.write_histograms(tmp_path, series, step=2)
    (buckets,) = tensorboard.read_histograms(tmp_path).values()
    assert buckets.tolist() == [[-1.0, 0.0, 3.0], [2.0, 3.0, 4.0]]
