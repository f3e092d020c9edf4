"""The one interface between the profiler's `ProbeSession` and a Keras backend."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy as np

#: One recorded tensor: `(layer path, kind, key)`, e.g. `("dense", "activations", "output")`.
Slot: TypeAlias = tuple[str, str, str]

#: How the hooks replace a method for as long as the probes are installed:
#: `replace(owner, name, value)` (the session restores it on `remove`).
Replace = Callable[[object, str, object], None]

#: `{id(variable): (layer path, weight name)}` of the model's trainable weights.
WeightOwners = Mapping[int, tuple[str, str]]

#: What `write_histograms` writes: `(tag, exponents, counts)` triples, bucket `i`
#: spanning `[exponents[i], exponents[i] + 1)`.
HistogramSeries = Iterable[tuple[str, np.ndarray, np.ndarray]]


@runtime_checkable
class ProbeHooks(Protocol):
    """What each backend module's `ProbeHooks(xla)` provides to the profiler's session."""

    @property
    def recording(self) -> bool:
        """Whether a train step of these hooks is being traced now (layer calls probe then)."""

    @property
    def tensor_count(self) -> int:
        """Number of slots seen so far (0 until the first probed step is traced)."""

    def install_step(self, model: Any, owners: WeightOwners, replace: Replace) -> None:
        """Wraps the model's train step and its optimizer so that each step records."""

    def rebuild_train_function(self, model: Any) -> None:
        """Rebuilds the model's train function, also between two steps of a running `fit`."""

    def probe(self, tensor: Any, forward: Slot, backward: Slot) -> Any:
        """Returns `tensor` through an identity recording it and the gradient flowing into it."""

    def record(self, slot: Slot, tensor: Any) -> None:
        """Records a forward value that needs no gradient (an internal such as attention logits)."""

    def read(self) -> dict[Slot, tuple[np.ndarray, np.ndarray]]:
        """Returns `{slot: (int64 counts, float64 floats)}` summed over steps and replicas."""

    def steps_recorded(self) -> int:
        """Returns the number of train steps run with the probes so far."""
