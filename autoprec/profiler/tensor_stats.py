"""`TensorStats`: the frozen statistics of one tensor, summed over the recorded steps."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .. import numerics
from ..errors import ProfileError
from .profile_json import (
    optional_number,
    read_histogram,
    require_count,
    require_mapping,
    require_number,
)


@dataclasses.dataclass(frozen=True, eq=False)
class TensorStats:
    """Statistics of one tensor, summed over the recorded steps (fields in docs/api.md); `histogram`
    counts `floor(log2(|x|))` of finite non-zero values over `numerics.HISTOGRAM_BINS` exponents."""

    count: int
    zeros: int
    nonfinite: int
    max_abs: float
    min_nonzero_abs: float | None
    sum_abs: float
    sum_squares: float
    histogram: np.ndarray
    nan: int = 0

    def __post_init__(self):
        histogram = np.array(self.histogram, dtype=np.int64)
        if histogram.shape != (numerics.HISTOGRAM_BINS,):
            raise ValueError(
                f"histogram must have {numerics.HISTOGRAM_BINS} bins, got shape {histogram.shape}"
            )
        histogram.setflags(write=False)
        object.__setattr__(self, "histogram", histogram)

    def __repr__(self) -> str:
        exponents = self.exponent_counts()
        span = f"2^{min(exponents)}..2^{max(exponents)}" if exponents else "empty"
        return (
            f"TensorStats(count={self.count}, zeros={self.zeros}, nonfinite={self.nonfinite}, "
            f"max_abs={self.max_abs:.4g}, min_nonzero_abs={self.min_nonzero_abs}, "
            f"exponents={span})"
        )

    @classmethod
    def from_raw(cls, counts: np.ndarray, floats: np.ndarray) -> TensorStats:
        """Builds statistics from a backend's raw `(counts, floats)` accumulators."""
        counts = np.asarray(counts, dtype=np.int64)
        nans = int(counts[279]) if counts.shape[0] > 279 else 0
        counts = counts[:279]
        min_nonzero = float(floats[1])
        return cls(
            nan=nans,
            count=int(counts.sum()),
            zeros=int(counts[0]),
            nonfinite=int(counts[255]),
            max_abs=float(floats[0]),
            min_nonzero_abs=min_nonzero if math.isfinite(min_nonzero) else None,
            sum_abs=float(floats[2]),
            sum_squares=float(floats[3]),
            histogram=np.concatenate([counts[256:279], counts[1:255]]),
        )

    @classmethod
    def from_values(cls, values: Any) -> TensorStats:
        """Computes the statistics of `values` on the host with NumPy (measured in float32)."""
        flat = np.asarray(values, dtype=np.float32).ravel()
        histogram, zeros, nonfinite = numerics.exponent_histogram(flat)
        finite = flat[np.isfinite(flat)].astype(np.float64)
        magnitudes = np.abs(finite)
        nonzero = magnitudes[magnitudes > 0]
        return cls(
            count=int(flat.size),
            zeros=zeros,
            nonfinite=nonfinite,
            nan=int(np.count_nonzero(np.isnan(flat))),
            max_abs=float(magnitudes.max()) if magnitudes.size else 0.0,
            min_nonzero_abs=float(nonzero.min()) if nonzero.size else None,
            sum_abs=float(magnitudes.sum()),
            sum_squares=float(np.square(finite).sum()),
            histogram=histogram,
        )

    @classmethod
    def merge(cls, stats: Iterable[TensorStats | None]) -> TensorStats | None:
        """Returns the statistics of the union of several tensors, or `None` for none."""
        items = [item for item in stats if item is not None]
        if not items:
            return None
        minima = [item.min_nonzero_abs for item in items if item.min_nonzero_abs is not None]
        summed = ("count", "zeros", "nonfinite", "nan", "sum_abs", "sum_squares")
        return cls(
            **{name: sum(getattr(item, name) for item in items) for name in summed},
            max_abs=max(item.max_abs for item in items),
            min_nonzero_abs=min(minima, default=None),
            histogram=np.sum([item.histogram for item in items], axis=0),
        )

    @property
    def finite(self) -> int:
        """Number of finite elements."""
        return self.count - self.nonfinite

    @property
    def mean_abs(self) -> float:
        """Mean magnitude over finite elements."""
        return self.sum_abs / self.finite if self.finite else 0.0

    @property
    def rms(self) -> float:
        """Root mean square over finite elements."""
        return math.sqrt(self.sum_squares / self.finite) if self.finite else 0.0

    def exponent_counts(self) -> dict[int, int]:
        """Returns `{exponent: count}` for the non-empty histogram bins."""
        exponents = numerics.bin_exponents()
        return {int(exponents[i]): int(self.histogram[i]) for i in np.flatnonzero(self.histogram)}

    def overflow_fraction(self, dtype: str = "float16", scale: float = 1.0) -> float:
        """Fraction of elements that overflow `dtype` after a power-of-two `scale`."""
        return numerics.overflow_fraction(self.histogram, self.count, dtype, scale)

    def underflow_fraction(self, dtype: str = "float16", scale: float = 1.0) -> float:
        """Fraction of elements that flush to zero in `dtype` after a power-of-two `scale`."""
        return numerics.underflow_fraction(self.histogram, self.count, dtype, scale)

    def subnormal_fraction(self, dtype: str = "float16", scale: float = 1.0) -> float:
        """Fraction of elements in `dtype`'s subnormal range after a power-of-two `scale`."""
        return numerics.subnormal_fraction(self.histogram, self.count, dtype, scale)

    def headroom_bits(self, dtype: str = "float16") -> float:
        """`log2(max(dtype) / max_abs)`: doublings left before overflow."""
        return numerics.headroom_bits(self.max_abs, dtype)

    def exceeds_max(self, dtype: str = "float16", scale: float = 1.0) -> bool:
        """Whether the largest magnitude times `scale` is above `dtype`'s largest finite value."""
        return numerics.exceeds_max(self.max_abs, dtype, scale)

    def fits(
        self,
        dtype: str = "float16",
        scale: float = 1.0,
        tolerance: float = numerics.UNDERFLOW_TOLERANCE,
    ) -> bool:
        """Whether the tensor, times `scale`, is representable in `dtype`."""
        return (
            self.nonfinite == 0
            and not self.exceeds_max(dtype, scale)
            and self.overflow_fraction(dtype, scale) == 0.0
            and self.underflow_fraction(dtype, scale) <= tolerance
        )

    @property
    def float16_overflow_fraction(self) -> float:
        """Fraction of elements with `|x| >= 2^16` (overflow in float16)."""
        return self.overflow_fraction("float16")

    @property
    def float16_underflow_fraction(self) -> float:
        """Fraction of elements with `0 < |x| < 2^-24` (flush to zero in float16)."""
        return self.underflow_fraction("float16")

    @property
    def bfloat16_overflow_fraction(self) -> float:
        """Fraction of elements beyond bfloat16's range (float32's top binade and above)."""
        return self.overflow_fraction("bfloat16")

    @property
    def bfloat16_underflow_fraction(self) -> float:
        """Fraction of elements with `0 < |x| < 2^-133` (flush to zero in bfloat16)."""
        return self.underflow_fraction("bfloat16")

    @property
    def float16_headroom_bits(self) -> float:
        """Doublings `max_abs` can take before exceeding 65504."""
        return self.headroom_bits("float16")

    @property
    def suggested_loss_scale(self) -> float:
        """Largest power-of-two scale keeping `max_abs * scale` under float16's max with margin."""
        return numerics.suggested_loss_scale(self.max_abs, "float16")

    @property
    def loss_scale_covers_range(self) -> bool:
        """Whether `suggested_loss_scale` also lifts the small significant values above 2^-24."""
        return numerics.loss_scale_covers_range(self.histogram, self.count, self.max_abs, "float16")

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict (the histogram as `{exponent: count}` for non-empty bins)."""
        data: dict[str, Any] = {name: getattr(self, name) for name in _JSON_FIELDS}
        data["exponents"] = {str(exponent): n for exponent, n in self.exponent_counts().items()}
        return data

    @classmethod
    def from_dict(cls, data: object, where: str) -> TensorStats:
        """Builds statistics from `to_dict` output, raising `ProfileError` naming `where`."""
        mapping = require_mapping(data, where)
        histogram = read_histogram(mapping.get("exponents"), f"{where}.exponents")
        values = {
            name: read(mapping.get(name, 0 if name == "nan" else None), f"{where}.{name}")
            for name, read in zip(_JSON_FIELDS, _JSON_READERS)
        }
        stats = cls(**values, histogram=histogram)
        if stats.zeros + stats.nonfinite + int(histogram.sum()) != stats.count:
            raise ProfileError(
                f"{where}: count {stats.count} does not equal zeros + nonfinite + histogram "
                f"total ({stats.zeros} + {stats.nonfinite} + {int(histogram.sum())}); the "
                "profile was edited or corrupted. Re-create it with autoprec.profile()."
            )
        return stats


#: The fields of `TensorStats.to_dict` besides its histogram, in order, and how each is read.
_JSON_FIELDS = (
    "count", "zeros", "nonfinite", "nan", "max_abs", "min_nonzero_abs", "sum_abs", "sum_squares",
)  # fmt: skip
_JSON_READERS = (*[require_count] * 4, require_number, optional_number, *[require_number] * 2)


def merge_groups(cls: type[TensorStats], *groups: Mapping[str, TensorStats]) -> TensorStats | None:
    """Returns the statistics of every tensor of some `{name: statistics}` groups together."""
    return cls.merge(stats for group in groups for stats in group.values())
