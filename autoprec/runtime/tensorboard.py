"""TensorBoard log of what autoprec does during training: loss scale, dtypes, events."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .._core.dtypes import count_dtypes
from ..errors import BackendError


def training_scalars(dtypes: Mapping[str, str], loss_scale: float | None) -> dict[str, float]:
    """Returns the per-epoch scalars: the loss scale and how many layers run in each dtype."""
    scalars: dict[str, float] = {}
    if loss_scale is not None:
        scalars["autoprec/loss_scale"] = loss_scale
    for dtype, count in count_dtypes(dtypes.values()).items():
        scalars[f"autoprec/layers_{dtype}"] = count
    return scalars


def dtype_table(dtypes: Mapping[str, str]) -> str:
    """Returns a Markdown table of every layer's dtype (TensorBoard renders Markdown text)."""
    rows = "\n".join(f"| `{path}` | {dtype} |" for path, dtype in dtypes.items())
    return f"| layer | dtype |\n|---|---|\n{rows}"


def events_text(events: Sequence[Mapping[str, Any]]) -> str:
    """Returns one Markdown line per event (promotion, fallback, divergence)."""
    lines = []
    for event in events:
        change = f"{event['from']} -> {event['to']}" if "from" in event else ""
        layer = f"`{event['layer']}` " if "layer" in event else ""
        lines.append(
            f"- step {event.get('step')}: {event.get('kind')} {layer}{change} "
            f"({event.get('evidence', '')})"
        )
    return "\n".join(lines)


class TrainingLog:
    """Writes autoprec's per-epoch scalars and text to a TensorBoard log directory."""

    def __init__(self, logdir: str | os.PathLike) -> None:
        try:  # TensorFlow stays optional on the JAX backend
            from .._backends import tensorflow as tensorflow_backend
        except ImportError as error:
            raise BackendError(
                f"tensorboard_dir needs TensorFlow to write summaries ({error}); "
                "pip install tensorflow, or leave tensorboard_dir unset."
            ) from None
        self.logdir = os.path.join(os.fspath(logdir), "autoprec")
        self._writer = tensorflow_backend.SummaryWriter(self.logdir)
        self._written_events = 0
        self._last_table: str | None = None

    def write_epoch(
        self,
        epoch: int,
        dtypes: Mapping[str, str],
        loss_scale: float | None,
        events: Sequence[Mapping[str, Any]],
    ) -> None:
        """Writes the epoch's scalars, the dtype table when it changed, and new events."""
        texts = {}
        table = dtype_table(dtypes)
        if table != self._last_table:
            texts["autoprec/plan"] = table
            self._last_table = table
        new_events = list(events[self._written_events :])
        if new_events:
            texts["autoprec/events"] = events_text(new_events)
            self._written_events = len(events)
        self._writer.write(epoch, training_scalars(dtypes, loss_scale), texts)

    def close(self) -> None:
        """Closes the event file."""
        self._writer.close()
