"""Per-layer value ranges of a model in training: probes, `profile()`, `ProfileCallback`, `Profile`.

The profiler records, for every layer (by its stable autoprec path, see
`autoprec.layers`), over a few real training steps:

* **activations**: each floating-point output of the layer (tuples and dicts
  of outputs are probed tensor by tensor; integer outputs are skipped);
* **activation gradients**: the gradient of the loss with respect to each
  of those outputs;
* **weight gradients**: the gradient of each trainable weight, exactly as the
  train step passes it to the optimizer (divided by the loss scale when the
  optimizer scales the loss);
* **weights**: the values of each trainable weight, read every step before
  the update;
* **internals**: intermediates computed inside a layer that never appear as a
  layer output. Covered: the attention logits of `MultiHeadAttention` (and
  subclasses) as they are computed in the compute dtype of the query/key
  projections. On the fused path Keras 3 takes by default (no dropout, no
  returned scores) the TensorFlow backend computes `einsum(query, key)`
  *before* scaling by `1/sqrt(key_dim)`, so the unscaled product is what must
  fit; with attention dropout or returned scores Keras scales the query
  first and the scaled scores are recorded. The logits are recomputed in
  float32 beside the layer's own computation (one extra einsum, forward only).

Every tensor is summarised by a `TensorStats`: element count, zeros,
non-finite values, largest and smallest non-zero magnitude, mean magnitude,
RMS and an exponent histogram (see `autoprec.numerics`). Statistics are
summed over the recorded steps (and replicas).

The probes run inside the compiled train step of `model.fit` (the model's
own `tf.function`, with or without XLA): each probed layer's `call` is
replaced, on the instance, by a wrapper that passes its outputs through a
custom-gradient identity updating statistic variables in the forward and the
backward pass; the optimizer's `apply_gradients` is wrapped the same way for
weight gradients. Removing the probes restores the original methods and
rebuilds the train function, so nothing of the profiler remains in the graph.

Layers that are not probed: pass-through layers (`autoprec.layers.is_pass_through`:
their values are a copy or selection of their input and they take their
producer's dtype) unless `include_pass_through=True`, and nested
Sequential/Functional models (their outputs are their last layers' outputs).

Example:

```python
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
prof = autoprec.profile(model, (x_train, y_train), steps=20)
print(prof.summary())
prof.layers["dense"].float16_safe
prof.save("profile.json")
```
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import types
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import keras
import numpy as np

from . import numerics
from ._core.io import atomic_write_json, parse_json_text, read_json_file
from .errors import ProfileError
from .layers import is_pass_through, layer_paths, model_fingerprint

#: Version of the profile JSON format written by `Profile.save`.
FORMAT_VERSION = 1

#: Key of a layer's single output in `LayerProfile.activations`.
OUTPUT_KEY = "output"

#: Name of the `MultiHeadAttention` internal in `LayerProfile.internals`.
ATTENTION_LOGITS = "attention_logits"

_KINDS = ("activations", "activation_gradients", "weights", "weight_gradients", "internals")
_ROOT_PATH = "<model>"


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

    Example:

    ```python
    layer = prof.layers["attention"]
    layer.internals["attention_logits"].max_abs, layer.float16_safe
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

    def __post_init__(self):
        for kind in _KINDS:
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
    def bfloat16_safe(self) -> bool:
        """Whether forward values and gradients fit bfloat16's range (precision not judged)."""
        return all(
            stats.fits("bfloat16") for stats in (self.forward, self.gradient) if stats is not None
        )

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        data: dict[str, Any] = {"class_name": self.class_name, "dtype": self.dtype}
        for kind in _KINDS:
            data[kind] = {key: stats.to_dict() for key, stats in getattr(self, kind).items()}
        return data

    @classmethod
    def from_dict(cls, path: str, data: object, where: str) -> LayerProfile:
        """Builds a layer profile from `to_dict` output, raising `ProfileError` naming `where`."""
        mapping = _require_mapping(data, where)
        groups = {}
        for kind in _KINDS:
            group = _require_mapping(mapping.get(kind, {}), f"{where}.{kind}")
            groups[kind] = {
                key: TensorStats.from_dict(value, f"{where}.{kind}[{key!r}]")
                for key, value in group.items()
            }
        return cls(
            path=path,
            class_name=_require_string(mapping.get("class_name"), f"{where}.class_name"),
            dtype=_require_string(mapping.get("dtype", "float32"), f"{where}.dtype"),
            **groups,
        )


class Profile:
    """Per-layer value ranges recorded over a few training steps.

    Args:
        layers: `{layer path: LayerProfile}` in model order.
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

    def __init__(
        self,
        layers: Mapping[str, LayerProfile],
        steps: int,
        model_name: str = "",
        fingerprint: str | None = None,
    ):
        self._layers = types.MappingProxyType(dict(layers))
        self.steps = int(steps)
        self.model_name = model_name
        self.fingerprint = fingerprint

    @property
    def layers(self) -> Mapping[str, LayerProfile]:
        """Read-only `{layer path: LayerProfile}`."""
        return self._layers

    def __repr__(self) -> str:
        return (
            f"Profile(model={self.model_name!r}, steps={self.steps}, layers={len(self._layers)}, "
            f"float16_unsafe={len(self.float16_unsafe_layers)})"
        )

    @property
    def suggested_loss_scale(self) -> float | None:
        """The model-wide float16 loss scale: the smallest of the layers' suggestions."""
        scales = [
            layer.suggested_loss_scale
            for layer in self._layers.values()
            if layer.suggested_loss_scale is not None
        ]
        return min(scales) if scales else None

    @property
    def float16_unsafe_layers(self) -> tuple[str, ...]:
        """Paths of layers that are not `float16_safe`, in model order."""
        return tuple(path for path, layer in self._layers.items() if not layer.float16_safe)

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
            "layers": {path: layer.to_dict() for path, layer in self._layers.items()},
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
        the layer is float16-safe.

        Args:
            max_rows: show at most this many layers (all when `None`).

        Returns:
            The table as a string.
        """
        rows = sorted(self._layers.values(), key=_risk_key)
        if max_rows is not None:
            rows = rows[:max_rows]
        header = (
            "layer",
            "class",
            "max|x|",
            "f16 ovf",
            "f16 ftz",
            "bf16 ftz",
            "max|g|",
            "loss scale",
            "g ftz@scale",
            "f16 safe",
        )
        table = [header] + [_summary_row(layer) for layer in rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        lines = [
            f"Profile of {self.model_name or 'model'}: {self.steps} steps, "
            f"{len(self._layers)} layers, float16 loss scale "
            f"{_format_scale(self.suggested_loss_scale)}"
        ]
        for index, row in enumerate(table):
            lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
            if index == 0:
                lines.append("  ".join("-" * width for width in widths))
        return "\n".join(lines)

    def to_tensorboard(self, logdir: str | os.PathLike, step: int = 0) -> None:
        """Writes every recorded exponent histogram as a TensorBoard histogram.

        Tags are `<layer path>/<kind>[/<name>]`; the x axis is the binary
        exponent `floor(log2|x|)` (zeros and non-finite values are left out).
        Needs the TensorFlow backend (TensorBoard itself is not needed to write).

        Args:
            logdir: TensorBoard log directory.
            step: the summary step to write at.
        """
        from ._backends import profiler_backend

        backend = profiler_backend("Profile.to_tensorboard")
        backend.write_histograms(logdir, self._histogram_series(), step=step)

    def _histogram_series(self) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        exponents = numerics.bin_exponents()
        for path, layer in self._layers.items():
            for kind in _KINDS:
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
        try:
            from matplotlib.colors import LogNorm
            from matplotlib.figure import Figure
        except ImportError as error:
            raise ImportError(
                "Profile.plot needs matplotlib: pip install matplotlib "
                "(or pip install 'autoprec[plot]')."
            ) from error
        panels = [("forward values", lambda layer: layer.forward)]
        if gradients:
            panels.append(("gradients", lambda layer: layer.gradient))
        paths = list(self._layers)
        matrices = [_fraction_matrix(self._layers.values(), select) for _, select in panels]
        low, high = _occupied_exponent_range(matrices)
        figure = Figure(figsize=(6 * len(panels), 1.5 + 0.25 * max(1, len(paths))))
        axes = figure.subplots(1, len(panels), squeeze=False)[0]
        image = None
        for axis, (title, _), matrix in zip(axes, panels, matrices):
            window = matrix[
                :,
                low - numerics.HISTOGRAM_MIN_EXPONENT : high + 1 - numerics.HISTOGRAM_MIN_EXPONENT,
            ]
            masked = np.ma.masked_less_equal(window, 0.0)
            image = axis.imshow(
                masked,
                aspect="auto",
                interpolation="nearest",
                extent=(low - 0.5, high + 0.5, len(paths) - 0.5, -0.5),
                norm=LogNorm(vmin=1e-6, vmax=1.0),
                cmap="viridis",
            )
            _mark_format_ranges(axis, low, high)
            axis.set_title(title)
            axis.set_xlabel("binary exponent floor(log2|x|)")
            axis.set_yticks(range(len(paths)))
            axis.set_yticklabels(paths, fontsize=7)
        axes[0].legend(loc="lower left", fontsize=6)
        if image is not None:
            figure.colorbar(image, ax=list(axes), label="fraction of elements")
        destination = Path(path)
        destination.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(destination, dpi=100)
        return destination


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


def _occupied_exponent_range(matrices: list[np.ndarray]) -> tuple[int, int]:
    occupied = np.flatnonzero(np.sum([matrix.sum(axis=0) for matrix in matrices], axis=0))
    float16 = numerics.FLOAT16
    low = float16.min_subnormal_exponent - 2
    high = float16.max_exponent + 2
    if occupied.size:
        low = min(low, int(occupied[0]) + numerics.HISTOGRAM_MIN_EXPONENT - 1)
        high = max(high, int(occupied[-1]) + numerics.HISTOGRAM_MIN_EXPONENT + 1)
    return low, high


def _mark_format_ranges(axis, low: int, high: int) -> None:
    styles = {"float16": ("tab:red", "--"), "bfloat16": ("tab:orange", ":")}
    for name, (colour, style) in styles.items():
        fmt = numerics.float_format(name)
        axis.axvspan(
            max(low - 0.5, fmt.min_normal_exponent - 0.5),
            min(high + 0.5, fmt.max_exponent + 0.5),
            color=colour,
            alpha=0.06,
        )
        for exponent, label in (
            (fmt.min_subnormal_exponent - 0.5, f"{name} flush to zero below"),
            (fmt.max_exponent + 0.5, f"{name} overflow above"),
        ):
            if low - 0.5 <= exponent <= high + 0.5:
                axis.axvline(exponent, color=colour, linestyle=style, linewidth=1, label=label)


def _risk_key(layer: LayerProfile) -> tuple:
    return (
        layer.float16_safe,
        not layer.float16_exceeds_max,
        -layer.float16_overflow_fraction,
        -layer.gradient_underflow_fraction,
        -layer.float16_underflow_fraction,
        layer.float16_headroom_bits,
    )


def _format_fraction(value: float) -> str:
    if value == 0:
        return "0"
    return f"{value:.2%}" if value >= 1e-4 else f"{value:.1e}"


def _format_scale(scale: float | None) -> str:
    if scale is None:
        return "-"
    return f"2^{int(round(math.log2(scale)))}"


def _summary_row(layer: LayerProfile) -> tuple[str, ...]:
    forward, gradient = layer.forward, layer.gradient
    return (
        layer.path,
        layer.class_name,
        f"{forward.max_abs:.3g}" if forward else "-",
        _format_fraction(layer.float16_overflow_fraction)
        + ("!" if layer.float16_exceeds_max else ""),
        _format_fraction(layer.float16_underflow_fraction),
        _format_fraction(layer.bfloat16_underflow_fraction),
        f"{gradient.max_abs:.3g}" if gradient else "-",
        _format_scale(layer.suggested_loss_scale),
        _format_fraction(layer.gradient_underflow_fraction) if gradient else "-",
        "yes" if layer.float16_safe else "NO",
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


# ----------------------------------------------------------------------------- probes


def _is_graph_model(layer: keras.layers.Layer) -> bool:
    return isinstance(layer, keras.Sequential) or (
        isinstance(layer, keras.Model)
        and hasattr(layer, "_operations")
        and hasattr(layer, "_nodes")
    )


def _is_multi_head_attention(layer: keras.layers.Layer) -> bool:
    return isinstance(layer, keras.layers.MultiHeadAttention)


def _probe_targets(model: keras.Model, include_pass_through: bool) -> dict[str, keras.layers.Layer]:
    """Layers whose outputs are probed, by stable path.

    Layers a recurrent layer runs once per time step inside its loop (its cell
    and everything under it) are left out: a probe's gradient inside a
    TensorFlow while loop cannot update statistic variables. The recurrent
    layer's own outputs are probed, and the cell's weights and weight
    gradients are recorded as for any layer.
    """
    paths = layer_paths(model)
    loop_prefixes = tuple(
        path + "/" for path, layer in paths.items() if isinstance(layer, keras.layers.RNN)
    )
    targets = {}
    for path, layer in paths.items():
        if type(layer).__name__ == "InputLayer" or _is_graph_model(layer):
            continue
        if not include_pass_through and is_pass_through(layer):
            continue
        if loop_prefixes and path.startswith(loop_prefixes):
            continue
        targets[path] = layer
    return targets


def _weight_owners(model: keras.Model) -> dict[int, tuple[str, str]]:
    """Maps `id(variable)` of each trainable weight to `(layer path, weight name)`."""
    owners: dict[int, tuple[str, str]] = {}
    for weight in model.trainable_weights:
        owners[id(weight)] = (_ROOT_PATH, weight.name)
    for path, layer in layer_paths(model).items():  # parents first: the deepest owner wins
        for weight in layer.trainable_weights:
            owners[id(weight)] = (path, weight.name)
    names_seen: dict[tuple[str, str], int] = {}
    unique: dict[int, tuple[str, str]] = {}
    for weight_id, (path, name) in owners.items():
        seen = names_seen.get((path, name), 0)
        names_seen[(path, name)] = seen + 1
        unique[weight_id] = (path, name if seen == 0 else f"{name}_{seen}")
    return unique


def _output_key(tree_path: tuple) -> str:
    if not tree_path:
        return OUTPUT_KEY
    return OUTPUT_KEY + "/" + "/".join(str(part) for part in tree_path)


#: Attributes Keras hangs on tensors that a probe's output must carry on:
#: the mask, and the logits behind a softmax/sigmoid output (the loss reads them).
_KERAS_TENSOR_ATTRIBUTES = ("_keras_mask", "_keras_logits")


def _copy_keras_attributes(source: object, target: object) -> None:
    for name in _KERAS_TENSOR_ATTRIBUTES:
        value = getattr(source, name, None)
        if value is not None:
            setattr(target, name, value)


def _attention_logits(
    layer: keras.layers.Layer, query: Any, key: Any, return_attention_scores: bool
) -> Any | None:
    """Recomputes, in float32, the attention logits MultiHeadAttention computes in its dtype."""
    ops = keras.ops
    if not hasattr(layer, "_inverse_sqrt_key_dim") or not hasattr(layer, "_dot_product_equation"):
        return None
    query = ops.cast(query, "float32")
    key = ops.cast(key, "float32")
    fused = not (
        getattr(layer, "_dropout", 0.0) > 0.0
        or return_attention_scores
        or len(query.shape) != 4
        or type(layer)._compute_attention is not keras.layers.MultiHeadAttention._compute_attention
    )
    if fused:
        # ops.dot_product_attention (TensorFlow backend) multiplies before scaling.
        logits = ops.einsum("btnh,bsnh->bnts", query, key)
    else:
        scaled_query = ops.multiply(query, layer._inverse_sqrt_key_dim)
        logits = ops.einsum(layer._dot_product_equation, key, scaled_query)
    return ops.stop_gradient(logits)


class _ProbeSession:
    """Installs probes on a model, collects what they record, and removes them."""

    def __init__(self, model: keras.Model, include_pass_through: bool = False):
        from ._backends import profiler_backend

        self.backend = profiler_backend("autoprec profiling")
        self.model = model
        self.targets = _probe_targets(model, include_pass_through)
        self.weight_owners = _weight_owners(model)
        self.accumulators: dict[tuple[str, str, str], Any] = {}
        self.recording = False
        self.installed = False
        self.xla = False
        self._gradient_multiplier = None
        self._statistics_cache = None
        self._step_counter = None
        self._undo: list[Callable[[], None]] = []
        self._original_jit_compile: bool | None = None

    # -- installing

    def install(self) -> None:
        """Wraps the train step, layer calls and `apply_gradients`, then rebuilds the train function."""
        if getattr(self.model, "_autoprec_probe_session", None) is not None:
            raise ProfileError(
                f"model {self.model.name!r} is already being profiled; finish that profile "
                "(or remove its ProfileCallback) first."
            )
        self._choose_xla()
        self._replace(self.model, "_autoprec_probe_session", self)
        self._replace(self.model, "train_step", self._wrap_train_step(self.model.train_step))
        optimizer = self.model.optimizer
        self._replace(optimizer, "apply_gradients", self._wrap_apply(optimizer.apply_gradients))
        for path, layer in self.targets.items():
            self._replace(layer, "call", self._wrap_call(path, layer.call))
            if _is_multi_head_attention(layer):
                self._replace(
                    layer,
                    "_compute_attention",
                    self._wrap_attention(path, layer, layer._compute_attention),
                )
        self.installed = True
        self.model.make_train_function(force=True)

    def _choose_xla(self) -> None:
        self.xla = bool(getattr(self.model, "jit_compile", False))
        if self.xla and not self.backend.xla_can_host_probes():
            warnings.warn(
                "autoprec: XLA cannot compile the profiler's probes on this machine; "
                f"model {self.model.name!r} is profiled with jit_compile=False and switched "
                "back to jit_compile=True afterwards.",
                stacklevel=3,
            )
            self._original_jit_compile = True
            self.model.jit_compile = False
            self.xla = False

    def _replace(self, owner: object, name: str, value: object) -> None:
        had_own = name in vars(owner)
        previous = vars(owner).get(name)
        object.__setattr__(owner, name, value)

        def undo() -> None:
            if had_own:
                object.__setattr__(owner, name, previous)
            else:
                object.__delattr__(owner, name)

        self._undo.append(undo)

    def _wrap_train_step(self, original: Callable) -> Callable:
        session = self

        @functools.wraps(original)
        def train_step(data):
            session.recording = True
            try:
                if session._step_counter is None:
                    session._step_counter = session.backend.StepCounter()
                session._step_counter.increment(data)
                session._gradient_multiplier = session.backend.inverse_loss_scale(
                    session.model.optimizer
                )
                session._statistics_cache = session.backend.StatisticsCache()
                return original(data)
            finally:
                session.recording = False
                session._gradient_multiplier = None
                session._statistics_cache = None

        return train_step

    def _wrap_call(self, path: str, original: Callable) -> Callable:
        session = self

        @functools.wraps(original)
        def call(*args, **kwargs):
            outputs = original(*args, **kwargs)
            if not session.recording:
                return outputs
            return session._probe_outputs(path, outputs)

        return call

    def _wrap_attention(self, path: str, layer: keras.layers.Layer, original: Callable) -> Callable:
        session = self

        @functools.wraps(original)
        def compute_attention(
            query,
            key,
            value,
            attention_mask=None,
            training=None,
            return_attention_scores=False,
            **kwargs,
        ):
            if session.recording:
                logits = _attention_logits(layer, query, key, return_attention_scores)
                if logits is not None:
                    accumulator = session._accumulator(path, "internals", ATTENTION_LOGITS)
                    session.backend.record(accumulator, logits, session.xla)
            return original(
                query, key, value, attention_mask, training, return_attention_scores, **kwargs
            )

        return compute_attention

    def _wrap_apply(self, original: Callable) -> Callable:
        session = self

        @functools.wraps(original)
        def apply_gradients(grads_and_vars):
            pairs = list(grads_and_vars)
            if session.recording:
                session._record_weights(pairs)
            return original(pairs)

        return apply_gradients

    # -- recording (at trace time, inside the train step)

    def _accumulator(self, path: str, kind: str, key: str):
        slot = (path, kind, key)
        if slot not in self.accumulators:
            self.accumulators[slot] = self.backend.TensorAccumulator(f"{path}/{kind}/{key}")
        return self.accumulators[slot]

    def _probe_outputs(self, path: str, outputs: Any) -> Any:
        flat = keras.tree.flatten_with_path(outputs)
        if not any(self.backend.is_float_tensor(value) for _, value in flat):
            return outputs
        probed = []
        for tree_path, value in flat:
            if not self.backend.is_float_tensor(value):
                probed.append(value)
                continue
            key = _output_key(tree_path)
            observed = self.backend.probe(
                value,
                self._accumulator(path, "activations", key),
                self._accumulator(path, "activation_gradients", key),
                self.xla,
                self._gradient_multiplier,
                self._statistics_cache,
            )
            _copy_keras_attributes(value, observed)
            probed.append(observed)
        if len(flat) == 1 and not flat[0][0]:
            return probed[0]
        return keras.tree.pack_sequence_as(outputs, probed)

    def _record_weights(self, pairs: list) -> None:
        for gradient, variable in pairs:
            owner = self.weight_owners.get(id(variable))
            if owner is None or gradient is None:
                continue
            path, name = owner
            self.backend.record(
                self._accumulator(path, "weight_gradients", name),
                gradient,
                self.xla,
                self._gradient_multiplier,
                self._statistics_cache,
            )
            self.backend.record(self._accumulator(path, "weights", name), variable.value, self.xla)

    # -- collecting and removing

    def steps_recorded(self) -> int:
        """Returns the number of train steps run with probes so far."""
        return 0 if self._step_counter is None else self._step_counter.read()

    def collect(self) -> Profile:
        """Reads every statistic variable into a `Profile`."""
        groups: dict[str, dict[str, dict[str, TensorStats]]] = {}
        for (path, kind, key), accumulator in self.accumulators.items():
            stats = TensorStats.from_raw(*accumulator.read())
            if stats.count == 0:
                continue
            groups.setdefault(path, {name: {} for name in _KINDS})[kind][key] = stats
        all_paths = layer_paths(self.model)
        layers = {}
        for path in [*all_paths, _ROOT_PATH]:
            if path not in groups:
                continue
            layer = all_paths.get(path, self.model)
            layers[path] = LayerProfile(
                path=path,
                class_name=type(layer).__name__,
                dtype=str(getattr(layer, "compute_dtype", "float32")),
                **groups[path],
            )
        return Profile(
            layers=layers,
            steps=self.steps_recorded(),
            model_name=self.model.name,
            fingerprint=model_fingerprint(self.model),
        )

    def remove(self) -> None:
        """Restores every wrapped method and rebuilds the train function without probes."""
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        if self._original_jit_compile is not None:
            self.model.jit_compile = self._original_jit_compile
            self._original_jit_compile = None
        if self.installed:
            self.installed = False
            self.model.make_train_function(force=True)


# ----------------------------------------------------------------------------- public entry points


class ProfileCallback(keras.callbacks.Callback):
    """Profiles the first `steps` train steps of a real `fit`, then removes its probes.

    After `steps` steps (or at the end of training, if it ends sooner) the
    result is in `.profile`, the probes are removed and the train function is
    rebuilt, so the rest of training runs at full speed.

    Args:
        steps: number of train steps to record.
        include_pass_through: also probe pass-through layers (Dropout,
            Flatten, MaxPooling, ReLU, ...), which cost time and duplicate
            their producers' statistics.
        stop_training: stop `fit` once the profile is complete.

    Example:

    ```python
    profiler = autoprec.ProfileCallback(steps=20)
    model.fit(x, y, epochs=1, callbacks=[profiler])
    print(profiler.profile.summary())
    ```
    """

    def __init__(
        self, steps: int = 20, include_pass_through: bool = False, stop_training: bool = False
    ):
        super().__init__()
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ProfileError(f"ProfileCallback: steps must be a positive integer, got {steps!r}.")
        self.steps = steps
        self.include_pass_through = include_pass_through
        self.stop_training = stop_training
        self.profile: Profile | None = None
        self._session: _ProbeSession | None = None

    def on_train_begin(self, logs=None):
        _require_compiled(self.model, "ProfileCallback")
        self.profile = None
        self._session = _ProbeSession(self.model, self.include_pass_through)
        try:
            self._session.install()
        except BaseException:
            self._session.remove()
            self._session = None
            raise

    def on_train_batch_end(self, batch, logs=None):
        if self._session is not None and self._session.steps_recorded() >= self.steps:
            self._finish()
            if self.stop_training:
                self.model.stop_training = True

    def on_train_end(self, logs=None):
        if self._session is not None:
            self._finish()

    def remove_probes(self) -> None:
        """Removes the probes now (e.g. after `fit` raised), keeping whatever was recorded."""
        if self._session is not None:
            self._finish()

    def _finish(self) -> None:
        session, self._session = self._session, None
        try:
            self.profile = session.collect()
        finally:
            session.remove()


def profile(
    model: keras.Model,
    data: Any,
    steps: int = 20,
    *,
    batch_size: int = 32,
    include_pass_through: bool = False,
) -> Profile:
    """Records per-layer value ranges over `steps` train steps, leaving the model unchanged.

    Runs `model.fit` for `steps` steps with probes (see the module docstring),
    then restores every model weight, the optimizer state and the metric state
    to what they were. An unbuilt model is first built on one batch, and an
    unbuilt optimizer is built (with its initial state) so it can be restored.

    Args:
        model: a compiled Keras model (TensorFlow backend).
        data: a `tf.data.Dataset` of batches, an `(x, y)` or
            `(x, y, sample_weight)` tuple of arrays, or a Python generator or
            `keras.utils.PyDataset` yielding batches.
        steps: number of train steps to record (fewer if the data runs out).
        batch_size: batch size for array data.
        include_pass_through: also probe pass-through layers.

    Returns:
        A `Profile`.

    Raises:
        ProfileError: if the model is not compiled or `data` is unusable.
        BackendError: if the Keras backend is not TensorFlow.

    Example:

    ```python
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    prof = autoprec.profile(model, (x, y), steps=10, batch_size=32)
    print(prof.summary())
    ```
    """
    from ._backends import profiler_backend

    profiler_backend("autoprec.profile")
    _require_compiled(model, "autoprec.profile")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ProfileError(f"autoprec.profile: steps must be a positive integer, got {steps!r}.")
    fit_arguments, sample_inputs = _fit_arguments(data, steps, batch_size)
    strategy = getattr(model, "distribute_strategy", None)
    with _strategy_scope(strategy):
        _ensure_built(model, sample_inputs)
        snapshot = _snapshot(model)
    callback = ProfileCallback(steps, include_pass_through=include_pass_through, stop_training=True)
    try:
        model.fit(**fit_arguments, verbose=0, callbacks=[callback])
    finally:
        callback.remove_probes()
        with _strategy_scope(strategy):
            _restore(model, snapshot)
    if callback.profile is None:
        raise ProfileError("autoprec.profile: no train step ran; `data` yielded no batches.")
    return callback.profile


def _require_compiled(model: keras.Model, caller: str) -> None:
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        raise ProfileError(
            f"{caller}: model {getattr(model, 'name', model)!r} is not compiled; profiling "
            "runs real train steps. Call model.compile(optimizer=..., loss=...) first."
        )


class _strategy_scope:
    """Enters `strategy.scope()` when there is a strategy (a no-op otherwise)."""

    def __init__(self, strategy: Any):
        self._scope = strategy.scope() if strategy is not None else None

    def __enter__(self):
        if self._scope is not None:
            self._scope.__enter__()

    def __exit__(self, *exc_info):
        if self._scope is not None:
            return self._scope.__exit__(*exc_info)
        return False


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


def _fit_arguments(data: Any, steps: int, batch_size: int) -> tuple[dict[str, Any], Any]:
    """Returns `(fit keyword arguments, sample inputs for building)` for any supported data."""
    if _is_dataset(data):
        cardinality = int(data.cardinality())
        sample = next(iter(data.take(1)), None)
        if sample is None:
            raise ProfileError("autoprec.profile: the dataset is empty.")
        if cardinality > 0:
            return {"x": data, "epochs": math.ceil(steps / cardinality)}, _inputs_of(sample)
        return {"x": data, "epochs": 1, "steps_per_epoch": steps}, _inputs_of(sample)
    if isinstance(data, (tuple, list)) and 2 <= len(data) <= 3 and not _is_array(data):
        x = data[0]
        first = keras.tree.flatten(x)[0]
        if not _is_array(first):
            raise ProfileError(
                "autoprec.profile: a tuple `data` must hold arrays: (x, y) or (x, y, sample_weight)."
            )
        samples = int(first.shape[0])
        batches = max(1, math.ceil(samples / batch_size))
        arguments = {
            "x": x,
            "y": data[1],
            "batch_size": batch_size,
            "epochs": math.ceil(steps / batches),
            "shuffle": False,
        }
        if len(data) == 3:
            arguments["sample_weight"] = data[2]
        sample = keras.tree.map_structure(lambda array: array[:batch_size], x)
        return arguments, sample
    if isinstance(data, Iterator):
        first = next(data, None)
        if first is None:
            raise ProfileError("autoprec.profile: the generator yielded no batch.")
        chained = _chain_first(first, data)
        return {"x": chained, "epochs": 1, "steps_per_epoch": steps}, _inputs_of(first)
    if isinstance(data, keras.utils.PyDataset):
        return {"x": data, "epochs": 1, "steps_per_epoch": steps}, _inputs_of(data[0])
    raise ProfileError(
        f"autoprec.profile: unsupported data of type {type(data).__name__}; pass a "
        "tf.data.Dataset, an (x, y) tuple of arrays, a generator or a keras.utils.PyDataset."
    )


def _chain_first(first: Any, rest: Iterator) -> Iterator:
    yield first
    yield from rest


def _is_dataset(data: Any) -> bool:
    return type(data).__module__.startswith("tensorflow") and hasattr(data, "cardinality")


def _inputs_of(batch: Any) -> Any:
    if isinstance(batch, (tuple, list)):
        return batch[0]
    return batch


def _ensure_built(model: keras.Model, sample_inputs: Any) -> None:
    if not model.built:
        model(sample_inputs, training=False)
    optimizer = model.optimizer
    if not optimizer.built and model.trainable_variables:
        optimizer.build(model.trainable_variables)


def _snapshot_variables(model: keras.Model) -> list:
    variables = list(model.variables) + list(model.optimizer.variables)
    variables += list(getattr(model, "metrics_variables", []))
    unique = {id(variable): variable for variable in variables}
    return list(unique.values())


def _snapshot(model: keras.Model) -> dict[str, Any]:
    variables = _snapshot_variables(model)
    return {
        "values": [(variable, np.array(variable.numpy(), copy=True)) for variable in variables],
        "attributes": {
            name: vars(model)[name] for name in ("history", "stop_training") if name in vars(model)
        },
    }


def _restore(model: keras.Model, snapshot: dict[str, Any]) -> None:
    known = {id(variable) for variable, _ in snapshot["values"]}
    for metric in getattr(model, "metrics", []):
        if any(id(variable) not in known for variable in metric.variables):
            metric.reset_state()
    for variable, value in snapshot["values"]:
        variable.assign(value)
    for name, value in snapshot["attributes"].items():
        object.__setattr__(model, name, value)
