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

#: The float32 bit layout the probes read: mantissa bits, exponent bias, the bits of the smallest
#: normal value and of infinity (NaNs are above), biased exponents and subnormal exponents.
MANTISSA_BITS, FLOAT32_EXPONENT_BIAS = 23, 127
SMALLEST_NORMAL_BITS, INFINITY_BITS = 1 << MANTISSA_BITS, 0x7F800000
BIASED_EXPONENT_BINS, SUBNORMAL_EXPONENTS = 256, 23
#: Length of the raw count vector: 256 biased-exponent slots (slot 0 the zeros, slot 255 the
#: non-finite values), 23 float32 subnormal exponents (-149 .. -127), then the NaNs among slot 255.
RAW_COUNT_SLOTS = BIASED_EXPONENT_BINS + SUBNORMAL_EXPONENTS + 1
#: Order of the float64 totals that go with the counts.
FLOAT_SLOTS = ("max_abs", "min_nonzero_abs", "sum_abs", "sum_squares")


@dataclasses.dataclass(frozen=True)
class KeptStep:
    """A train step the optimizer skipped: its batch (NumPy or device arrays) and loss scale."""

    batch: Any
    loss_scale: float


def empty_totals() -> tuple[np.ndarray, np.ndarray]:
    """Returns the `(counts, floats)` totals of a slot that measured nothing yet."""
    return np.zeros(RAW_COUNT_SLOTS, np.int64), np.array([0.0, np.inf, 0.0, 0.0])


def combine_totals(
    totals: Iterable[tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray]:
    """Adds totals of one slot: counts and sums add, maxima and minima combine."""
    items = list(totals)
    counts = np.sum([np.asarray(counts, np.int64) for counts, _ in items], axis=0)
    floats = np.stack([np.asarray(floats, np.float64) for _, floats in items])
    return counts, np.array(
        [floats[:, 0].max(), floats[:, 1].min(), floats[:, 2].sum(), floats[:, 3].sum()]
    )


def is_float_tensor(value: object) -> bool:
    """Returns whether `value` is a tensor (of any backend) with a floating-point dtype."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or not hasattr(value, "shape"):
        return False
    try:
        return keras.backend.is_float_dtype(keras.backend.standardize_dtype(dtype))
    except (TypeError, ValueError):
        return False
