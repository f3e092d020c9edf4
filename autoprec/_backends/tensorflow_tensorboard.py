"""TensorFlow's TensorBoard output: exponent histograms, scalars and text as event files."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from .instrument import HistogramSeries


def write_histograms(
    logdir: str | os.PathLike,
    series: HistogramSeries,
    step: int = 0,
    description: Callable[[str], str] | None = None,
) -> None:
    """Writes exponent histograms as TensorBoard histogram summaries."""
    from tensorflow.core.framework import summary_pb2

    writer = tf.summary.create_file_writer(str(logdir))
    with writer.as_default():
        for tag, exponents, counts in series:
            metadata = summary_pb2.SummaryMetadata(
                display_name=tag,
                summary_description=description(tag) if description else "",
            )
            metadata.plugin_data.plugin_name = "histograms"
            buckets = np.stack(
                [
                    np.asarray(exponents, np.float64),
                    np.asarray(exponents, np.float64) + 1.0,
                    np.asarray(counts, np.float64),
                ],
                axis=1,
            )
            tf.summary.write(tag=tag, tensor=tf.constant(buckets), step=step, metadata=metadata)
    writer.flush()
    writer.close()


def read_histograms(logdir: str | os.PathLike) -> dict[str, np.ndarray]:
    """Reads back the histogram summaries that `write_histograms` wrote."""
    from tensorflow.core.util import event_pb2

    found: dict[str, np.ndarray] = {}
    for path in sorted(tf.io.gfile.glob(os.path.join(str(logdir), "events.out.tfevents.*"))):
        for record_bytes in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(record_bytes.numpy())
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "histograms":
                    found[value.tag] = tf.make_ndarray(value.tensor)
    return found


def _write_plugin_summary(tag: str, tensor: tf.Tensor, step: int, plugin: str) -> None:
    """Writes one summary in a TensorBoard plugin's format, without needing TensorBoard."""
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata(display_name=tag)
    metadata.plugin_data.plugin_name = plugin
    tf.summary.write(tag=tag, tensor=tensor, step=step, metadata=metadata)


class SummaryWriter:
    """Writes scalars and text next to Keras' own TensorBoard logs (one event file per run)."""

    def __init__(self, logdir: str | os.PathLike) -> None:
        self._writer = tf.summary.create_file_writer(str(logdir))

    def write(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None:
        """Writes `scalars` and Markdown `texts` at `step` and flushes."""
        with self._writer.as_default():
            for tag, value in scalars.items():
                _write_plugin_summary(tag, tf.constant(float(value), tf.float32), step, "scalars")
            for tag, text in texts.items():
                _write_plugin_summary(tag, tf.constant(text), step, "text")
        self._writer.flush()

    def close(self) -> None:
        """Flushes and closes the event file."""
        self._writer.close()
