"""What both backends' in-step instrumentation shares: the types of its interface."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias

import keras
import numpy as np

#: One recorded tensor: `(layer path, kind, key)`, e.g. `("dense", "activations", "output")`.
Slot: TypeAlias = tuple[str, str, str]
#: How the hooks replace a method for as long as they are installed: `replace(owner, name, value)`.
Replace = Callable[[object, str, object], None]
#: `{id(variable): (layer path, weight name)}` of the model's trainable weights.
WeightOwners = Mapping[int, tuple[str, str]]
#: What `write_histograms` writes: `(tag, exponents, counts)` triples, bucket `i`
#: spanning `[exponents[i], exponents[i] + 1)`.
HistogramSeries = Iterable[tuple[str, np.ndarray, np.ndarray]]
#: The statistics the probes take: exact exponent histograms (the profiler) or only each
#: tensor's largest finite magnitude and its non-finite counts (the guard's replay).
STATISTICS = ("histograms", "amax")


@dataclasses.dataclass(frozen=True)
class KeptStep:
    """A train step the optimizer skipped: its batch (NumPy or device arrays) and loss scale."""

    batch: Any
    loss_scale: float


def is_float_tensor(value: object) -> bool:
    """Returns whether `value` is a tensor (of any backend) with a floating-point dtype."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or not hasattr(value, "shape"):
        return False
    try:
        return keras.backend.is_float_dtype(keras.backend.standardize_dtype(dtype))
    except (TypeError, ValueError):
        return False
