"""Float8 ranges: how a `Dense`/`EinsumDense` layer's tensors fit float8 under Keras' scaling."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import numerics
from ..errors import ProfileError
from .profile_json import (
    FLOAT8_FORMAT_NAMES,
    FLOAT8_TENSORS,
    optional_number,
    require_count,
    require_float8_format,
    require_mapping,
    require_number,
)
from .tensor_stats import TensorStats


@dataclasses.dataclass(frozen=True)
class Float8TensorRange:
    """How one tensor of a float8-eligible layer fits its float8 format under Keras' delayed
    per-tensor scaling (fields in docs/api.md)."""

    format: str
    amax: float
    values: int
    nonfinite: int
    flush_fraction: float
    saturation_fraction: float | None
    amax_growth: float | None
    steps: int = 0

    @classmethod
    def measure(
        cls,
        dtype: str,
        total: TensorStats,
        observed: Sequence[TensorStats] = (),
        steps_per_observation: int = 1,
    ) -> Float8TensorRange:
        """Measures one tensor from its statistics over the window and, where given, summed up to each
        observed step (`steps_per_observation` train steps apart)."""
        fmt = numerics.format_for(dtype)
        flush = numerics.float8_flush_fraction(
            total.histogram, total.max_abs, fmt, min_abs=total.min_nonzero_abs
        )
        saturation = growth = None
        if observed:
            per_step = max(1, int(steps_per_observation))
            delay = max(1, math.ceil(numerics.FLOAT8_SCALE_DELAY_STEPS / per_step))
            history = max(1, math.ceil(numerics.FLOAT8_MIN_HISTORY_STEPS / per_step))
            running = [stats.max_abs for stats in observed]
            previous = [np.zeros_like(observed[0].histogram), *(s.histogram for s in observed)]
            histograms = [after - before for before, after in zip(previous, previous[1:])]
            saturation = numerics.float8_delayed_saturation_fraction(
                histograms,
                running,
                delay=delay,
                clip_tolerance=2.0**-fmt.mantissa_bits,
                min_history=history,
            )
            growth = numerics.amax_growth(running, min_history=history)
            if growth is not None and per_step > 1:
                growth = growth ** (1.0 / per_step)
        return cls(
            format=fmt.name,
            amax=total.max_abs,
            values=int(total.histogram.sum()),
            nonfinite=total.nonfinite,
            flush_fraction=flush,
            saturation_fraction=saturation,
            amax_growth=growth,
            steps=len(observed),
        )

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object, where: str) -> Float8TensorRange:
        """Builds the range from `to_dict` output, raising `ProfileError` naming `where`."""
        mapping = require_mapping(data, where)
        readers = {
            "format": require_float8_format, "amax": require_number, "values": require_count,
            "nonfinite": require_count, "flush_fraction": require_number,
            "saturation_fraction": optional_number, "amax_growth": optional_number,
            "steps": require_count,
        }  # fmt: skip
        defaults = {"nonfinite": 0, "steps": 0}
        return cls(
            **{
                name: read(mapping.get(name, defaults.get(name)), f"{where}.{name}")
                for name, read in readers.items()
            }
        )


@dataclasses.dataclass(frozen=True)
class Float8Ranges:
    """What a float8 decision needs for one `Dense` or `EinsumDense` layer: its three quantized
    tensors (`FLOAT8_TENSORS`), `None` where not recorded, and the verdict (docs/api.md)."""

    inputs: Float8TensorRange | None = None
    kernel: Float8TensorRange | None = None
    output_gradients: Float8TensorRange | None = None

    @property
    def tensors(self) -> dict[str, Float8TensorRange]:
        """`{tensor name: Float8TensorRange}` of the recorded tensors, in `FLOAT8_TENSORS` order."""
        ranges = {name: getattr(self, name) for name in FLOAT8_TENSORS}
        return {name: value for name, value in ranges.items() if value is not None}

    @property
    def flush_fraction(self) -> float:
        """The largest `flush_fraction` of the three tensors (0.0 when none was recorded)."""
        return max((item.flush_fraction for item in self.tensors.values()), default=0.0)

    @property
    def saturation_fraction(self) -> float | None:
        """The largest `saturation_fraction` of the three tensors, or `None` when none was measured."""
        values = [item.saturation_fraction for item in self.tensors.values()]
        return max((value for value in values if value is not None), default=None)

    @property
    def amax_growth(self) -> float | None:
        """The largest `amax_growth` of the three tensors, or `None` when none was measured."""
        values = [item.amax_growth for item in self.tensors.values()]
        return max((value for value in values if value is not None), default=None)

    @property
    def safe(self) -> bool:
        """Whether the three tensors fit float8 under Keras' per-tensor delayed scaling."""
        return self.unsafe_reason is None

    @property
    def unsafe_reason(self) -> str | None:
        """Why the layer is not float8-safe, in words (tensor, figure, format), or `None`."""
        reasons = [_reasons(FLOAT8_TENSORS[name][1], item) for name, item in self.tensors.items()]
        return next((reason for check in zip(*reasons) for reason in check if reason), None)

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict of the recorded tensors."""
        return {name: item.to_dict() for name, item in self.tensors.items()}

    @classmethod
    def from_dict(cls, data: object, where: str) -> Float8Ranges:
        """Builds the ranges from `to_dict` output, raising `ProfileError` naming `where`."""
        mapping = require_mapping(data, where)
        unknown = sorted(set(mapping) - set(FLOAT8_TENSORS))
        if unknown:
            raise ProfileError(
                f"{where}: unknown float8 tensor(s) {', '.join(map(repr, unknown))}; expected "
                f"{', '.join(FLOAT8_TENSORS)}."
            )
        return cls(
            **{
                name: Float8TensorRange.from_dict(value, f"{where}.{name}")
                for name, value in mapping.items()
                if value is not None
            }
        )


def _reasons(words: str, item: Float8TensorRange) -> list[str | None]:
    """Why `item` does not fit float8, by check: non-finite, flush, saturation, growth (`None`: fits)."""
    fmt = FLOAT8_FORMAT_NAMES.get(item.format, item.format)
    flush = numerics.FLOAT8_FLUSH_TOLERANCE
    saturation = numerics.FLOAT8_SATURATION_TOLERANCE
    growth = numerics.FLOAT8_MAX_AMAX_GROWTH
    reasons: list[str | None] = [None] * 4
    if item.nonfinite:
        reasons[0] = (
            f"its {words} hold {item.nonfinite} non-finite value(s) (inf or NaN), which no float8 "
            f"{fmt} scale can represent"
        )
    if item.flush_fraction > flush:
        reasons[1] = (
            f"{item.flush_fraction:.2%} of its non-zero {words} round to zero in float8 "
            f"{fmt} once scaled to their amax {item.amax:.3g} (at most {flush:.2%} may)"
        )
    if item.saturation_fraction is not None and item.saturation_fraction > saturation:
        reasons[2] = (
            f"{item.saturation_fraction:.2%} of its {words} are clipped to float8 "
            f"{fmt}'s max: their amax grows, and Keras scales each step by the amax "
            f"of steps {numerics.FLOAT8_SCALE_DELAY_STEPS} or more before (at most "
            f"{saturation:.2%} may)"
        )
    if item.amax_growth is not None and item.amax_growth > growth:
        reasons[3] = (
            f"the amax of its {words} grew {item.amax_growth:.3g}x in one step (at most {growth:g}x): "
            f"the float8 {fmt} scale comes from earlier steps, so that step's "
            "largest values are clipped to under half their size"
        )
    return reasons
