"""The statistics model of a profile: `TensorStats`, `LayerProfile`, `Profile` and their JSON.

A `Dense` or `EinsumDense` layer's `LayerProfile.float8` (`Float8Ranges`)
holds what a float8 decision needs: for its inputs, kernel and output
gradients (`Float8TensorRange`), the flush-to-zero and saturation fractions
under Keras' per-tensor delayed scaling and the amax growth per step.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import numerics
from .._core.io import atomic_write_json, parse_json_text, read_json_file
from ..errors import ProfileError
from . import views

#: Version of the profile JSON format written by `Profile.save`.
FORMAT_VERSION = 1

#: Key of a layer's single output in `LayerProfile.activations`.
OUTPUT_KEY = "output"

#: Name of the `MultiHeadAttention` internal in `LayerProfile.internals`.
ATTENTION_LOGITS = "attention_logits"

#: The recorded kinds of tensors, each a `{name: TensorStats}` field of `LayerProfile`.
TENSOR_KINDS = ("activations", "activation_gradients", "weights", "weight_gradients", "internals")

#: Key in `Profile.layers` for the weights the model owns itself (held by no layer).
ROOT_PATH = "<model>"


@dataclasses.dataclass(frozen=True, eq=False)
class TensorStats:
    """Statistics of one tensor, summed over the recorded steps.

    Attributes:
        count: number of elements seen (zeros and non-finite values included).
        zeros: number of exact zeros.
        nonfinite: number of infs and NaNs.
        max_abs: largest finite magnitude (0.0 when there is none).
        min_nonzero_abs: smallest finite non-zero magnitude, or `None`.
        sum_abs: sum of finite magnitudes.
        sum_squares: sum of squares of finite values.
        histogram: read-only int64 array of `numerics.HISTOGRAM_BINS` counts of
            `floor(log2(|x|))` over finite non-zero values, exponents
            `numerics.HISTOGRAM_MIN_EXPONENT` (-149) to `HISTOGRAM_MAX_EXPONENT` (127).
        nan: how many of the non-finite values are NaN (the rest are infinities:
            an overflow gives inf, while a NaN usually comes from the data).

    Example:

    ```python
    stats = prof.layers["dense"].activation
    stats.max_abs, stats.float16_overflow_fraction, stats.exponent_counts()
    ```
    """

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
        subnormal = counts[256:279]
        normal = counts[1:255]
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
            histogram=np.concatenate([subnormal, normal]),
        )

    @classmethod
    def from_values(cls, values: Any) -> TensorStats:
        """Computes the statistics of `values` on the host with NumPy (measured in float32).

        Args:
            values: any array-like of numbers (e.g. a kernel read from its variable).

        Returns:
            A `TensorStats`.

        Example:

        ```python
        TensorStats.from_values(layer.kernel.numpy()).max_abs
        ```
        """
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
    def merge(cls, stats: Iterable[TensorStats]) -> TensorStats | None:
        """Returns the statistics of the union of several tensors, or `None` for none."""
        items = [item for item in stats if item is not None]
        if not items:
            return None
        minima = [item.min_nonzero_abs for item in items if item.min_nonzero_abs is not None]
        return cls(
            count=sum(item.count for item in items),
            zeros=sum(item.zeros for item in items),
            nonfinite=sum(item.nonfinite for item in items),
            nan=sum(item.nan for item in items),
            max_abs=max(item.max_abs for item in items),
            min_nonzero_abs=min(minima) if minima else None,
            sum_abs=sum(item.sum_abs for item in items),
            sum_squares=sum(item.sum_squares for item in items),
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
        """Whether the tensor, times `scale`, is representable in `dtype`.

        Args:
            dtype: the format.
            scale: a power-of-two factor (a loss scale for gradients).
            tolerance: fraction of elements allowed to flush to zero.

        Returns:
            True when nothing is non-finite, nothing exceeds the maximum and at
            most `tolerance` of the elements flush to zero.
        """
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
    def float16_subnormal_fraction(self) -> float:
        """Fraction of elements with `2^-24 <= |x| < 2^-14` (float16 subnormals)."""
        return self.subnormal_fraction("float16")

    @property
    def bfloat16_overflow_fraction(self) -> float:
        """Fraction of elements beyond bfloat16's range (float32's top binade and above)."""
        return self.overflow_fraction("bfloat16")

    @property
    def bfloat16_underflow_fraction(self) -> float:
        """Fraction of elements with `0 < |x| < 2^-133` (flush to zero in bfloat16)."""
        return self.underflow_fraction("bfloat16")

    @property
    def bfloat16_subnormal_fraction(self) -> float:
        """Fraction of elements in bfloat16's subnormal range (`2^-133 <= |x| < 2^-126`)."""
        return self.subnormal_fraction("bfloat16")

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
        return {
            "count": self.count,
            "zeros": self.zeros,
            "nonfinite": self.nonfinite,
            "nan": self.nan,
            "max_abs": self.max_abs,
            "min_nonzero_abs": self.min_nonzero_abs,
            "sum_abs": self.sum_abs,
            "sum_squares": self.sum_squares,
            "exponents": {str(key): value for key, value in self.exponent_counts().items()},
        }

    @classmethod
    def from_dict(cls, data: object, where: str) -> TensorStats:
        """Builds statistics from `to_dict` output, raising `ProfileError` naming `where`."""
        mapping = _require_mapping(data, where)
        histogram = np.zeros(numerics.HISTOGRAM_BINS, dtype=np.int64)
        for key, value in _require_mapping(mapping.get("exponents"), f"{where}.exponents").items():
            exponent = _parse_exponent(key, f"{where}.exponents")
            histogram[exponent - numerics.HISTOGRAM_MIN_EXPONENT] = _require_count(
                value, f"{where}.exponents[{key!r}]"
            )
        min_nonzero = mapping.get("min_nonzero_abs")
        stats = cls(
            count=_require_count(mapping.get("count"), f"{where}.count"),
            zeros=_require_count(mapping.get("zeros"), f"{where}.zeros"),
            nonfinite=_require_count(mapping.get("nonfinite"), f"{where}.nonfinite"),
            nan=_require_count(mapping.get("nan", 0), f"{where}.nan"),
            max_abs=_require_number(mapping.get("max_abs"), f"{where}.max_abs"),
            min_nonzero_abs=None
            if min_nonzero is None
            else _require_number(min_nonzero, f"{where}.min_nonzero_abs"),
            sum_abs=_require_number(mapping.get("sum_abs"), f"{where}.sum_abs"),
            sum_squares=_require_number(mapping.get("sum_squares"), f"{where}.sum_squares"),
            histogram=histogram,
        )
        if stats.zeros + stats.nonfinite + int(histogram.sum()) != stats.count:
            raise ProfileError(
                f"{where}: count {stats.count} does not equal zeros + nonfinite + histogram "
                f"total ({stats.zeros} + {stats.nonfinite} + {int(histogram.sum())}); the "
                "profile was edited or corrupted. Re-create it with autoprec.profile()."
            )
        return stats


#: The tensors Keras' float8 path quantizes, each with its format and its name in words.
FLOAT8_TENSORS: Mapping[str, tuple[str, str]] = types.MappingProxyType(
    {
        "inputs": (numerics.FLOAT8_E4M3.name, "inputs"),
        "kernel": (numerics.FLOAT8_E4M3.name, "kernel"),
        "output_gradients": (numerics.FLOAT8_E5M2.name, "output gradients"),
    }
)

#: Short names of the float8 formats, as reasons and the summary write them.
FLOAT8_FORMAT_NAMES: Mapping[str, str] = types.MappingProxyType(
    {numerics.FLOAT8_E4M3.name: "E4M3", numerics.FLOAT8_E5M2.name: "E5M2"}
)


@dataclasses.dataclass(frozen=True)
class Float8TensorRange:
    """How one tensor of a float8-eligible layer fits its float8 format under Keras' scaling.

    Keras multiplies the tensor by `format max / amax` (`numerics.float8_scale`),
    the amax coming from a history of earlier steps (see
    `numerics.FLOAT8_SCALE_DELAY_STEPS`). Fractions are of the finite non-zero
    values seen.

    Attributes:
        format: `"float8_e4m3fn"` or `"float8_e5m2"`.
        amax: largest finite magnitude over the recorded steps: the amax a
            history covering them scales by.
        values: finite non-zero values seen.
        nonfinite: infs and NaNs seen.
        flush_fraction: fraction that rounds to zero once scaled by `max / amax`.
        saturation_fraction: fraction that Keras' delayed scale clips to the
            format's max by more than the format's own spacing (relative
            `2^-mantissa_bits`; smaller clips are within float8's rounding):
            step `t` is scaled by the amax of steps `<= t - 2`
            (`numerics.FLOAT8_SCALE_DELAY_STEPS`), and only steps whose history
            holds `numerics.FLOAT8_MIN_HISTORY_STEPS` steps are judged; `None`
            when the steps were not observed one by one or were too few.
        amax_growth: largest factor by which one step's amax exceeded that of
            every earlier step (at most 1.0 when it never grew), over the steps
            after the first `numerics.FLOAT8_MIN_HISTORY_STEPS`; `None` when not
            observed step by step or too few steps.
        steps: observations behind `saturation_fraction` and `amax_growth`
            (0: window totals only).

    Example:

    ```python
    kernel = prof.layers["dense"].float8.kernel
    kernel.flush_fraction, kernel.amax_growth
    ```
    """

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
        """Measures one tensor from its statistics over the window and, if any, after each step.

        Args:
            dtype: the float8 format, e.g. `"float8_e4m3fn"` (aliases accepted).
            total: the tensor's statistics over the recorded steps.
            observed: its statistics summed up to each observed step, in order
                (differences give each step's histogram, `max_abs` a bound of
                each step's amax).
            steps_per_observation: train steps between two observations
                (`steps_per_execution`); the delay and the growth per step are
                converted accordingly.

        Returns:
            A `Float8TensorRange`.

        Example:

        ```python
        Float8TensorRange.measure("e4m3", layer.weights["kernel"])
        ```
        """
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
        mapping = _require_mapping(data, where)
        return cls(
            format=_require_float8_format(mapping.get("format"), f"{where}.format"),
            amax=_require_number(mapping.get("amax"), f"{where}.amax"),
            values=_require_count(mapping.get("values"), f"{where}.values"),
            nonfinite=_require_count(mapping.get("nonfinite", 0), f"{where}.nonfinite"),
            flush_fraction=_require_number(
                mapping.get("flush_fraction"), f"{where}.flush_fraction"
            ),
            saturation_fraction=_optional_number(
                mapping.get("saturation_fraction"), f"{where}.saturation_fraction"
            ),
            amax_growth=_optional_number(mapping.get("amax_growth"), f"{where}.amax_growth"),
            steps=_require_count(mapping.get("steps", 0), f"{where}.steps"),
        )


@dataclasses.dataclass(frozen=True)
class Float8Ranges:
    """What a float8 decision needs for one `Dense` or `EinsumDense` layer.

    Keras' float8 path quantizes three tensors, each scaled per tensor: the
    layer's inputs and its kernel to E4M3, the gradients of its matmul output
    to E5M2 (`FLOAT8_TENSORS`). A tensor that was not recorded is `None` and
    is not judged.

    Attributes:
        inputs: the layer's inputs, as the layer received them.
        kernel: the kernel's values, read every step before the update.
        output_gradients: the gradients flowing back into the matmul output
            (before the bias and activation: the gradient Keras quantizes).

    The verdict (`safe`, `unsafe_reason`) fails on the first of: a non-finite
    value; more than `numerics.FLOAT8_FLUSH_TOLERANCE` of a tensor's non-zero
    values rounding to zero; more than `numerics.FLOAT8_SATURATION_TOLERANCE`
    clipped by the delayed scale; an amax growing by more than
    `numerics.FLOAT8_MAX_AMAX_GROWTH` in one step.

    Example:

    ```python
    ranges = prof.layers["dense"].float8
    ranges.inputs.flush_fraction, ranges.safe, ranges.unsafe_reason
    ```
    """

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
        """Why the layer is not float8-safe, in words (tensor, figure, format), or `None`.

        Example:

        ```python
        prof.layers["dense"].float8.unsafe_reason
        # "63.10% of its non-zero inputs round to zero in float8 E4M3 once scaled to
        #  their amax 1.2e+04 (at most 1.00% may)"
        ```
        """
        for check in (_nonfinite_reason, _flush_reason, _saturation_reason, _growth_reason):
            for name, item in self.tensors.items():
                reason = check(FLOAT8_TENSORS[name][1], item)
                if reason is not None:
                    return reason
        return None

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict of the recorded tensors."""
        return {name: item.to_dict() for name, item in self.tensors.items()}

    @classmethod
    def from_dict(cls, data: object, where: str) -> Float8Ranges:
        """Builds the ranges from `to_dict` output, raising `ProfileError` naming `where`."""
        mapping = _require_mapping(data, where)
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


def _format_name(item: Float8TensorRange) -> str:
    return FLOAT8_FORMAT_NAMES.get(item.format, item.format)


def _nonfinite_reason(words: str, item: Float8TensorRange) -> str | None:
    if not item.nonfinite:
        return None
    return (
        f"its {words} hold {item.nonfinite} non-finite value(s) (inf or NaN), which no float8 "
        f"{_format_name(item)} scale can represent"
    )


def _flush_reason(words: str, item: Float8TensorRange) -> str | None:
    tolerance = numerics.FLOAT8_FLUSH_TOLERANCE
    if item.flush_fraction <= tolerance:
        return None
    return (
        f"{item.flush_fraction:.2%} of its non-zero {words} round to zero in float8 "
        f"{_format_name(item)} once scaled to their amax {item.amax:.3g} (at most "
        f"{tolerance:.2%} may)"
    )


def _saturation_reason(words: str, item: Float8TensorRange) -> str | None:
    tolerance = numerics.FLOAT8_SATURATION_TOLERANCE
    if item.saturation_fraction is None or item.saturation_fraction <= tolerance:
        return None
    return (
        f"{item.saturation_fraction:.2%} of its {words} are clipped to float8 "
        f"{_format_name(item)}'s max: their amax grows, and Keras scales each step by the amax "
        f"of steps {numerics.FLOAT8_SCALE_DELAY_STEPS} or more before (at most "
        f"{tolerance:.2%} may)"
    )


def _growth_reason(words: str, item: Float8TensorRange) -> str | None:
    limit = numerics.FLOAT8_MAX_AMAX_GROWTH
    if item.amax_growth is None or item.amax_growth <= limit:
        return None
    return (
        f"the amax of its {words} grew {item.amax_growth:.3g}x in one step (at most {limit:g}x): "
        f"the float8 {_format_name(item)} scale comes from earlier steps, so that step's "
        "largest values are clipped to under half their size"
    )


def _merged(*groups: Mapping[str, TensorStats]) -> TensorStats | None:
    return TensorStats.merge(stats for group in groups for stats in group.values())


@dataclasses.dataclass(frozen=True)
class LayerProfile:
    """What the profiler recorded for one layer.

    The float16 figures judge the layer as if it computed in float16: its
    *forward values* (activations and internals) must fit float16 as they are,
    its *gradients* (activation gradients and weight gradients) must fit with
    some power-of-two loss scale.

    Attributes:
        path: the layer's stable autoprec path.
        class_name: the layer's class name.
        dtype: the layer's compute dtype while it was profiled.
        activations: `{output key: TensorStats}`; the key is `"output"` for a
            single output, `"output/0"`, `"output/<name>"` for tuples and dicts.
        activation_gradients: `{output key: TensorStats}` of the loss gradient
            with respect to each output.
        weights: `{weight name: TensorStats}` of each trainable weight's values.
        weight_gradients: `{weight name: TensorStats}` of each trainable weight's gradient.
        internals: `{name: TensorStats}` of internal intermediates
            (`"attention_logits"` for `MultiHeadAttention`).
        float8: what a float8 decision needs (`Float8Ranges`) for a `Dense` or
            `EinsumDense` layer, `None` for other classes (and for profiles
            written before autoprec recorded it).

    Example:

    ```python
    layer = prof.layers["attention"]
    layer.internals["attention_logits"].max_abs, layer.float16_safe
    prof.layers["dense"].float8_safe, prof.layers["dense"].float8_unsafe_reason
    ```
    """

    path: str
    class_name: str
    dtype: str
    activations: Mapping[str, TensorStats]
    activation_gradients: Mapping[str, TensorStats]
    weights: Mapping[str, TensorStats]
    weight_gradients: Mapping[str, TensorStats]
    internals: Mapping[str, TensorStats]
    float8: Float8Ranges | None = None

    def __post_init__(self):
        for kind in TENSOR_KINDS:
            object.__setattr__(self, kind, types.MappingProxyType(dict(getattr(self, kind))))

    @property
    def activation(self) -> TensorStats | None:
        """All floating-point outputs together, or `None` if none was recorded."""
        return _merged(self.activations)

    @property
    def activation_gradient(self) -> TensorStats | None:
        """Gradients with respect to all outputs together, or `None`."""
        return _merged(self.activation_gradients)

    @property
    def weight_gradient(self) -> TensorStats | None:
        """All weight gradients together, or `None` (no trainable weights)."""
        return _merged(self.weight_gradients)

    @property
    def forward(self) -> TensorStats | None:
        """Activations and internals together: the values computed in the layer's dtype."""
        return _merged(self.activations, self.internals)

    @property
    def gradient(self) -> TensorStats | None:
        """Activation and weight gradients together: the values loss scaling must fit."""
        return _merged(self.activation_gradients, self.weight_gradients)

    @property
    def float16_overflow_fraction(self) -> float:
        """Fraction of forward values (activations and internals) that overflow float16."""
        forward = self.forward
        return forward.float16_overflow_fraction if forward else 0.0

    @property
    def float16_exceeds_max(self) -> bool:
        """Whether any forward value is above 65504 (the exact test behind overflow risk)."""
        forward = self.forward
        return bool(forward and forward.exceeds_max("float16"))

    @property
    def float16_underflow_fraction(self) -> float:
        """Fraction of forward values that flush to zero in float16."""
        forward = self.forward
        return forward.float16_underflow_fraction if forward else 0.0

    @property
    def bfloat16_overflow_fraction(self) -> float:
        """Fraction of forward values that overflow bfloat16."""
        forward = self.forward
        return forward.bfloat16_overflow_fraction if forward else 0.0

    @property
    def bfloat16_underflow_fraction(self) -> float:
        """Fraction of forward values that flush to zero in bfloat16."""
        forward = self.forward
        return forward.bfloat16_underflow_fraction if forward else 0.0

    @property
    def float16_headroom_bits(self) -> float:
        """Doublings the largest forward value can take before exceeding 65504."""
        forward = self.forward
        return forward.float16_headroom_bits if forward else math.inf

    @property
    def suggested_loss_scale(self) -> float | None:
        """Largest power-of-two loss scale keeping this layer's gradients under float16's max.

        `None` when no gradient was recorded. The model-wide scale is the
        smallest over layers (`Profile.suggested_loss_scale`).
        """
        gradient = self.gradient
        return gradient.suggested_loss_scale if gradient else None

    @property
    def gradient_underflow_fraction(self) -> float:
        """Fraction of gradient values that still flush to zero at `suggested_loss_scale`."""
        gradient = self.gradient
        if gradient is None:
            return 0.0
        return gradient.underflow_fraction("float16", gradient.suggested_loss_scale)

    @property
    def loss_scale_covers_range(self) -> bool:
        """Whether one loss scale fits both the largest and the small significant gradients."""
        gradient = self.gradient
        return gradient.loss_scale_covers_range if gradient else True

    @property
    def float16_safe(self) -> bool:
        """Whether the layer fits float16: forward values as they are, gradients with a loss scale.

        True when the forward values have no non-finite values, none above
        65504 and at most `numerics.UNDERFLOW_TOLERANCE` flushing to zero, and
        the gradients are finite and `loss_scale_covers_range`.
        """
        forward, gradient = self.forward, self.gradient
        if forward is not None and not forward.fits("float16"):
            return False
        if gradient is None:
            return True
        return gradient.nonfinite == 0 and gradient.loss_scale_covers_range

    @property
    def float16_unsafe_reason(self) -> str | None:
        """Why the layer is not `float16_safe`, in words, or `None` when it is.

        The first failing test of `float16_safe` is named, with its numbers.

        Example:

        ```python
        prof.layers["attention"].float16_unsafe_reason
        # "forward values up to 1e+05, above float16's max 65504 (33.33% of them overflow)"
        ```
        """
        forward, gradient = self.forward, self.gradient
        if forward is not None:
            if forward.nonfinite:
                return f"{forward.nonfinite} non-finite forward value(s)"
            overflow = forward.overflow_fraction("float16")
            if forward.exceeds_max("float16") or overflow > 0.0:
                return (
                    f"forward values up to {forward.max_abs:.3g}, above float16's max 65504 "
                    f"({overflow:.2%} of them overflow)"
                )
            underflow = forward.underflow_fraction("float16")
            if underflow > numerics.UNDERFLOW_TOLERANCE:
                return (
                    f"{underflow:.2%} of forward values flush to zero in float16 (at most "
                    f"{numerics.UNDERFLOW_TOLERANCE:.2%} allowed)"
                )
        if gradient is not None:
            if gradient.nonfinite:
                return f"{gradient.nonfinite} non-finite gradient value(s)"
            if not gradient.loss_scale_covers_range:
                return (
                    "no float16 loss scale fits both the largest and the small gradients "
                    f"(largest {gradient.max_abs:.3g})"
                )
        return None

    @property
    def float8_safe(self) -> bool | None:
        """Whether the layer fits float8 (`Float8Ranges.safe`); `None` without float8 ranges.

        `None` for layers Keras has no float8 path for (all but `Dense` and
        `EinsumDense`): there is nothing to judge.
        """
        return None if self.float8 is None else self.float8.safe

    @property
    def float8_unsafe_reason(self) -> str | None:
        """Why the layer is not `float8_safe`, in words, or `None` when it is (or has no ranges).

        Example:

        ```python
        prof.layers["dense"].float8_unsafe_reason
        # "63.10% of its non-zero inputs round to zero in float8 E4M3 once scaled to
        #  their amax 1.2e+04 (at most 1.00% may)"
        ```
        """
        return None if self.float8 is None else self.float8.unsafe_reason

    @property
    def bfloat16_safe(self) -> bool:
        """Whether forward values and gradients fit bfloat16's range (precision not judged)."""
        return all(
            stats.fits("bfloat16") for stats in (self.forward, self.gradient) if stats is not None
        )

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        data: dict[str, Any] = {"class_name": self.class_name, "dtype": self.dtype}
        for kind in TENSOR_KINDS:
            data[kind] = {key: stats.to_dict() for key, stats in getattr(self, kind).items()}
        if self.float8 is not None:
            data["float8"] = self.float8.to_dict()
        return data

    @classmethod
    def from_dict(cls, path: str, data: object, where: str) -> LayerProfile:
        """Builds a layer profile from `to_dict` output, raising `ProfileError` naming `where`."""
        mapping = _require_mapping(data, where)
        groups = {}
        for kind in TENSOR_KINDS:
            group = _require_mapping(mapping.get(kind, {}), f"{where}.{kind}")
            groups[kind] = {
                key: TensorStats.from_dict(value, f"{where}.{kind}[{key!r}]")
                for key, value in group.items()
            }
        float8 = mapping.get("float8")
        return cls(
            path=path,
            class_name=_require_string(mapping.get("class_name"), f"{where}.class_name"),
            dtype=_require_string(mapping.get("dtype", "float32"), f"{where}.dtype"),
            float8=None if float8 is None else Float8Ranges.from_dict(float8, f"{where}.float8"),
            **groups,
        )


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Profile:
    """Per-layer value ranges recorded over a few training steps.

    Attributes:
        layers: read-only `{layer path: LayerProfile}` in model order.
        steps: number of train steps recorded.
        model_name: the profiled model's name.
        fingerprint: `autoprec.layers.model_fingerprint` of the profiled model.

    Example:

    ```python
    prof = autoprec.profile(model, dataset, steps=20)
    print(prof.summary())
    prof.suggested_loss_scale
    prof.save("profile.json")
    same = autoprec.Profile.load("profile.json")
    ```
    """

    layers: Mapping[str, LayerProfile]
    steps: int
    model_name: str = ""
    fingerprint: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "layers", types.MappingProxyType(dict(self.layers)))
        object.__setattr__(self, "steps", int(self.steps))

    def __repr__(self) -> str:
        return (
            f"Profile(model={self.model_name!r}, steps={self.steps}, layers={len(self.layers)}, "
            f"float16_unsafe={len(self.float16_unsafe_layers)})"
        )

    @property
    def suggested_loss_scale(self) -> float | None:
        """The model-wide float16 loss scale: the smallest of the layers' suggestions."""
        scales = [
            layer.suggested_loss_scale
            for layer in self.layers.values()
            if layer.suggested_loss_scale is not None
        ]
        return min(scales) if scales else None

    @property
    def float16_unsafe_layers(self) -> tuple[str, ...]:
        """Paths of layers that are not `float16_safe`, in model order."""
        return tuple(path for path, layer in self.layers.items() if not layer.float16_safe)

    @property
    def float16_unsafe_reasons(self) -> dict[str, str]:
        """`{path: LayerProfile.float16_unsafe_reason}` of the layers that are not `float16_safe`.

        Example:

        ```python
        for path, reason in prof.float16_unsafe_reasons.items():
            print(f"{path}: {reason}")
        ```
        """
        reasons = {path: layer.float16_unsafe_reason for path, layer in self.layers.items()}
        return {path: reason for path, reason in reasons.items() if reason is not None}

    @property
    def float8_unsafe_layers(self) -> tuple[str, ...]:
        """Paths of the `Dense`/`EinsumDense` layers that are not `float8_safe`, in model order."""
        return tuple(path for path, layer in self.layers.items() if layer.float8_safe is False)

    @property
    def float8_unsafe_reasons(self) -> dict[str, str]:
        """`{path: LayerProfile.float8_unsafe_reason}` of the layers that are not `float8_safe`.

        Example:

        ```python
        for path, reason in prof.float8_unsafe_reasons.items():
            print(f"{path}: {reason}")
        ```
        """
        reasons = {path: layer.float8_unsafe_reason for path, layer in self.layers.items()}
        return {path: reason for path, reason in reasons.items() if reason is not None}

    def to_dict(self) -> dict[str, Any]:
        """Returns the JSON-ready dict written by `save`."""
        return {
            "format_version": FORMAT_VERSION,
            "kind": "autoprec.profile",
            "model_name": self.model_name,
            "fingerprint": self.fingerprint,
            "steps": self.steps,
            "histogram_exponents": [
                numerics.HISTOGRAM_MIN_EXPONENT,
                numerics.HISTOGRAM_MAX_EXPONENT,
            ],
            "layers": {path: layer.to_dict() for path, layer in self.layers.items()},
        }

    @classmethod
    def from_dict(cls, data: object, source: str = "profile") -> Profile:
        """Builds a profile from `to_dict` output.

        Args:
            data: the decoded JSON value.
            source: the file or string it came from, named in errors.

        Returns:
            A `Profile`.

        Raises:
            ProfileError: naming `source` and the field when `data` is malformed.
        """
        mapping = _require_mapping(data, source)
        version = mapping.get("format_version")
        if version is None:
            raise ProfileError(
                f"{source}: missing field 'format_version'; this is not an autoprec profile "
                "(write one with Profile.save)."
            )
        if not isinstance(version, int) or isinstance(version, bool) or version > FORMAT_VERSION:
            raise ProfileError(
                f"{source}: format_version {version!r} is not supported (this autoprec reads "
                f"up to {FORMAT_VERSION}); upgrade autoprec or re-create the profile."
            )
        layers_data = _require_mapping(mapping.get("layers"), f"{source}: layers")
        layers = {
            path: LayerProfile.from_dict(path, value, f"{source}: layers[{path!r}]")
            for path, value in layers_data.items()
        }
        fingerprint = mapping.get("fingerprint")
        return cls(
            layers=layers,
            steps=_require_count(mapping.get("steps"), f"{source}: steps"),
            model_name=str(mapping.get("model_name", "")),
            fingerprint=None if fingerprint is None else str(fingerprint),
        )

    def to_json(self) -> str:
        """Returns the profile as JSON text."""
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> Profile:
        """Parses JSON text written by `to_json`/`save`, raising `ProfileError` if malformed."""
        return cls.from_dict(parse_json_text(text, ProfileError, "profile", source), source)

    def save(self, path: str | os.PathLike) -> Path:
        """Writes the profile as JSON, atomically.

        Args:
            path: destination file.

        Returns:
            The destination as a `Path`.
        """
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Profile:
        """Reads a profile written by `save`, raising `ProfileError` naming the file and field."""
        data = read_json_file(path, ProfileError, "profile")
        return cls.from_dict(data, str(path))

    def summary(self, max_rows: int | None = None) -> str:
        """Returns a text table of the layers, riskiest for float16 first.

        Columns: largest forward magnitude, float16 overflow and flush-to-zero
        fractions of forward values, bfloat16 flush-to-zero, largest gradient,
        suggested loss scale, gradient flush-to-zero at that scale, and whether
        the layer is float16-safe. When some layer has float8 ranges (`Dense`,
        `EinsumDense`), four more: the largest float8 flush-to-zero fraction of
        its tensors (and which: `in`, `kernel`, `grad`), the largest saturation
        under Keras' delayed scale, the largest amax growth per step, and
        whether the layer is float8-safe.

        Args:
            max_rows: show at most this many layers (all when `None`).

        Returns:
            The table as a string.
        """
        rows = [_summary_row(layer) for layer in self.layers.values()]
        return views.summary_table(
            self.model_name, self.steps, self.suggested_loss_scale, rows, max_rows
        )

    def to_tensorboard(self, logdir: str | os.PathLike, step: int = 0) -> None:
        """Writes every recorded exponent histogram as a TensorBoard histogram.

        Tags are `<layer path>/<kind>[/<name>]`; the x axis is the binary
        exponent `floor(log2|x|)` (zeros and non-finite values are left out).
        Needs TensorFlow installed, whichever the Keras backend (TensorBoard
        itself is not needed to write).

        Args:
            logdir: TensorBoard log directory.
            step: the summary step to write at.
        """
        views.write_tensorboard(logdir, self._histogram_series(), step=step)

    def _histogram_series(self) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        exponents = numerics.bin_exponents()
        for path, layer in self.layers.items():
            for kind in TENSOR_KINDS:
                for key, stats in getattr(layer, kind).items():
                    occupied = np.flatnonzero(stats.histogram)
                    if occupied.size == 0:
                        continue
                    window = slice(occupied[0], occupied[-1] + 1)
                    suffix = "" if key == OUTPUT_KEY else f"/{key}"
                    yield f"{path}/{kind}{suffix}", exponents[window], stats.histogram[window]

    def plot(self, path: str | os.PathLike, gradients: bool = True) -> Path:
        """Saves a heat map of exponent histograms: layers by log2 bins, format ranges marked.

        Each row is one layer's forward values (and, in a second panel, its
        gradients); colour is the fraction of that row's elements in each
        binary exponent. The float16 and bfloat16 normal ranges are shaded
        and their flush-to-zero and overflow limits drawn as lines.

        Args:
            path: image file to write (format from the suffix, e.g. `.png`).
            gradients: whether to add the gradient panel.

        Returns:
            The written path.

        Raises:
            ImportError: if matplotlib is not installed.
        """
        selections: list[tuple[str, Callable[[LayerProfile], TensorStats | None]]] = [
            ("forward values", lambda layer: layer.forward)
        ]
        if gradients:
            selections.append(("gradients", lambda layer: layer.gradient))
        panels = [
            (title, _fraction_matrix(self.layers.values(), select)) for title, select in selections
        ]
        return views.heat_map(path, list(self.layers), panels)


def _fraction_matrix(
    layers: Iterable[LayerProfile], select: Callable[[LayerProfile], TensorStats | None]
) -> np.ndarray:
    rows = []
    for layer in layers:
        stats = select(layer)
        if stats is None or stats.count == 0:
            rows.append(np.zeros(numerics.HISTOGRAM_BINS))
        else:
            rows.append(stats.histogram / stats.count)
    return np.array(rows).reshape(-1, numerics.HISTOGRAM_BINS)


def _summary_row(layer: LayerProfile) -> views.SummaryRow:
    forward, gradient = layer.forward, layer.gradient
    return views.SummaryRow(
        path=layer.path,
        class_name=layer.class_name,
        max_forward=forward.max_abs if forward else None,
        float16_overflow_fraction=layer.float16_overflow_fraction,
        float16_exceeds_max=layer.float16_exceeds_max,
        float16_underflow_fraction=layer.float16_underflow_fraction,
        bfloat16_underflow_fraction=layer.bfloat16_underflow_fraction,
        max_gradient=gradient.max_abs if gradient else None,
        loss_scale=layer.suggested_loss_scale,
        gradient_underflow_fraction=layer.gradient_underflow_fraction,
        float16_headroom_bits=layer.float16_headroom_bits,
        float16_safe=layer.float16_safe,
        float8=_float8_cells(layer.float8),
    )


def _float8_cells(ranges: Float8Ranges | None) -> views.Float8Cells | None:
    if ranges is None:
        return None
    flushing = max(ranges.tensors.items(), key=lambda item: item[1].flush_fraction, default=None)
    return views.Float8Cells(
        flush_fraction=ranges.flush_fraction,
        flush_tensor=None if flushing is None else flushing[0],
        saturation_fraction=ranges.saturation_fraction,
        amax_growth=ranges.amax_growth,
        safe=ranges.safe,
    )


# ----------------------------------------------------------------------------- validation


def _require_mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ProfileError(
            f"{where}: expected a JSON object, got {type(value).__name__}; the profile is "
            "malformed. Re-create it with autoprec.profile()."
        )
    return value


def _require_count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProfileError(f"{where}: expected a non-negative integer, got {value!r}.")
    return value


def _require_number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProfileError(f"{where}: expected a finite number, got {value!r}.")
    return float(value)


def _optional_number(value: object, where: str) -> float | None:
    return None if value is None else _require_number(value, where)


def _require_float8_format(value: object, where: str) -> str:
    if value not in FLOAT8_FORMAT_NAMES:
        raise ProfileError(
            f"{where}: expected one of {', '.join(FLOAT8_FORMAT_NAMES)}, got {value!r}."
        )
    return str(value)


def _require_string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ProfileError(f"{where}: expected a string, got {value!r}.")
    return value


def _parse_exponent(key: object, where: str) -> int:
    try:
        exponent = int(str(key))
    except ValueError:
        raise ProfileError(f"{where}: key {key!r} is not an integer exponent.") from None
    if not numerics.HISTOGRAM_MIN_EXPONENT <= exponent <= numerics.HISTOGRAM_MAX_EXPONENT:
        raise ProfileError(
            f"{where}: exponent {exponent} is outside "
            f"[{numerics.HISTOGRAM_MIN_EXPONENT}, {numerics.HISTOGRAM_MAX_EXPONENT}]."
        )
    return exponent
