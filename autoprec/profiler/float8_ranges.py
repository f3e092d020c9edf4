"""Float8 ranges: how a `Dense`/`EinsumDense` layer's tensors fit float8 under Keras' scaling."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import numerics
from . import profile_json
from .profile_json import FLOAT8_FORMAT_NAMES, FLOAT8_TENSORS
from .tensor_stats import TensorStats


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
        return profile_json.float8_range_to_dict(self)

    @classmethod
    def from_dict(cls, data: object, where: str) -> Float8TensorRange:
        """Builds the range from `to_dict` output, raising `ProfileError` naming `where`."""
        return profile_json.float8_range_from_dict(cls, data, where)


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
        """Why the layer is not float8-safe, in words (tensor, figure, format), or `None`."""
        for check in (_nonfinite_reason, _flush_reason, _saturation_reason, _growth_reason):
            for name, item in self.tensors.items():
                reason = check(FLOAT8_TENSORS[name][1], item)
                if reason is not None:
                    return reason
        return None

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict of the recorded tensors."""
        return profile_json.float8_ranges_to_dict(self)

    @classmethod
    def from_dict(cls, data: object, where: str) -> Float8Ranges:
        """Builds the ranges from `to_dict` output, raising `ProfileError` naming `where`."""
        return profile_json.float8_ranges_from_dict(cls, data, where, Float8TensorRange.from_dict)


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
