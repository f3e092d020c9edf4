"""TensorFlow's TensorBoard output: exponent histograms, scalars and text as event files.

The profiler's `Profile.to_tensorboard` writes its exponent histograms with
`write_histograms` (on JAX too, through `jax_probes`, where TensorFlow is
installed), and the runtime's TensorBoard logger writes the guard's scalars and
plan tables with `SummaryWriter`. Every summary is written in the TensorBoard
plugin's own format with `tf.summary.write`, so TensorBoard itself need not be
installed to write them.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from .probe_hooks import HistogramSeries


def write_histograms(
    logdir: str | os.PathLike,
    series: HistogramSeries,
    step: int = 0,
    description: Callable[[str], str] | None = None,
) -> None:
    """Writes exponent histograms as TensorBoard histogram summaries.

    Each histogram is stored in TensorBoard's own histogram format (a
    `[k, 3]` tensor of left edge, right edge and count, plugin `histograms`),
    with bucket edges in log2 units, so no TensorBoard install is needed to
    write it.

    Args:
        logdir: the TensorBoard log directory.
        series: `(tag, exponents, counts)` triples; bucket `i` spans
            `[exponents[i], exponents[i] + 1)`.
        step: the summary step.
        description: optional function returning a description for a tag.

    Example:

    ```python
    write_histograms("logs", [("dense/output", np.array([-2, 0]), np.array([3, 5]))])
    ```
    """
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
    """Reads back the histogram summaries that `write_histograms` wrote.

    Args:
        logdir: the TensorBoard log directory.

    Returns:
        `{tag: [k, 3] array}` of left edge, right edge and count per bucket
        (the last one written of a tag, over every event file of `logdir`).

    Example:

    ```python
    read_histograms("logs")["dense/output"][:, 2]  # [3.0, 5.0]
    ```
    """
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
    """Writes scalars and text next to Keras' own TensorBoard logs (one event file per run).

    Args:
        logdir: the TensorBoard log directory (a sub-folder is fine).

    Example:

    ```python
    writer = SummaryWriter("logs/autoprec")
    writer.write(3, {"loss_scale": 1024.0}, {"plan": "**dense**: float16"})
    writer.close()
    ```
    """

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
