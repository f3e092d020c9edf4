"""The profile: `LayerProfile` (what was recorded for one layer) and `Profile` (every layer)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .. import numerics
from .._core.io import atomic_write_json, parse_json_text, read_json_file
from ..errors import BackendError, ProfileError
from . import views
from .float8_ranges import Float8Ranges, Float8TensorRange
from .profile_json import (
    ATTENTION_LOGITS,
    FLOAT8_TENSORS,
    FORMAT_KIND,
    FORMAT_VERSION,
    OUTPUT_KEY,
    ROOT_PATH,
    TENSOR_KINDS,
    require_count,
    require_mapping,
    require_string,
)
from .tensor_stats import TensorStats, merge_groups

__all__ = [
    "ATTENTION_LOGITS",
    "FLOAT8_TENSORS",
    "FORMAT_VERSION",
    "OUTPUT_KEY",
    "ROOT_PATH",
    "TENSOR_KINDS",
    "Float8Ranges",
    "Float8TensorRange",
    "LayerProfile",
    "Profile",
    "TensorStats",
]


def _of(stats: TensorStats | None, name: str, default: Any) -> Any:
    """`stats.<name>`, or `default` where nothing was recorded."""
    return default if stats is None else getattr(stats, name)


@dataclasses.dataclass(frozen=True)
class LayerProfile:
    """What the profiler recorded for one layer: `{name: TensorStats}` per tensor kind, merged views
    and the float16 (forward values as they are, gradients with a loss scale), bfloat16 and float8
    verdicts (fields in docs/api.md)."""

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
        return merge_groups(TensorStats, self.activations)

    @property
    def activation_gradient(self) -> TensorStats | None:
        """Gradients with respect to all outputs together, or `None`."""
        return merge_groups(TensorStats, self.activation_gradients)

    @property
    def weight_gradient(self) -> TensorStats | None:
        """All weight gradients together, or `None` (no trainable weights)."""
        return merge_groups(TensorStats, self.weight_gradients)

    @property
    def forward(self) -> TensorStats | None:
        """Activations and internals together: the values computed in the layer's dtype."""
        return merge_groups(TensorStats, self.activations, self.internals)

    @property
    def gradient(self) -> TensorStats | None:
        """Activation and weight gradients together: the values loss scaling must fit."""
        return merge_groups(TensorStats, self.activation_gradients, self.weight_gradients)

    @property
    def float16_overflow_fraction(self) -> float:
        """Fraction of forward values (activations and internals) that overflow float16."""
        return _of(self.forward, "float16_overflow_fraction", 0.0)

    @property
    def float16_exceeds_max(self) -> bool:
        """Whether any forward value is above 65504 (the exact test behind overflow risk)."""
        forward = self.forward
        return bool(forward and forward.exceeds_max("float16"))

    @property
    def float16_underflow_fraction(self) -> float:
        """Fraction of forward values that flush to zero in float16."""
        return _of(self.forward, "float16_underflow_fraction", 0.0)

    @property
    def bfloat16_overflow_fraction(self) -> float:
        """Fraction of forward values that overflow bfloat16."""
        return _of(self.forward, "bfloat16_overflow_fraction", 0.0)

    @property
    def bfloat16_underflow_fraction(self) -> float:
        """Fraction of forward values that flush to zero in bfloat16."""
        return _of(self.forward, "bfloat16_underflow_fraction", 0.0)

    @property
    def float16_headroom_bits(self) -> float:
        """Doublings the largest forward value can take before exceeding 65504."""
        return _of(self.forward, "float16_headroom_bits", math.inf)

    @property
    def suggested_loss_scale(self) -> float | None:
        """Largest power-of-two loss scale keeping this layer's gradients under float16's max."""
        return _of(self.gradient, "suggested_loss_scale", None)

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
        return _of(self.gradient, "loss_scale_covers_range", True)

    @property
    def float16_safe(self) -> bool:
        """Whether the layer fits float16: forward values as they are, gradients with a loss scale."""
        forward, gradient = self.forward, self.gradient
        if forward is not None and not forward.fits("float16"):
            return False
        return gradient is None or (gradient.nonfinite == 0 and gradient.loss_scale_covers_range)

    @property
    def float16_unsafe_reason(self) -> str | None:
        """Why the layer is not `float16_safe`, in words, or `None` when it is."""
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
        """Whether the layer fits float8 (`Float8Ranges.safe`); `None` without float8 ranges."""
        return None if self.float8 is None else self.float8.safe

    @property
    def float8_unsafe_reason(self) -> str | None:
        """Why the layer is not `float8_safe`, in words, or `None` when it is (or has no ranges)."""
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
        mapping = require_mapping(data, where)
        groups = {}
        for kind in TENSOR_KINDS:
            group = require_mapping(mapping.get(kind, {}), f"{where}.{kind}")
            groups[kind] = {
                key: TensorStats.from_dict(value, f"{where}.{kind}[{key!r}]")
                for key, value in group.items()
            }
        float8 = mapping.get("float8")
        return cls(
            path=path,
            class_name=require_string(mapping.get("class_name"), f"{where}.class_name"),
            dtype=require_string(mapping.get("dtype", "float32"), f"{where}.dtype"),
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
        unrecorded: paths of the layers whose recording raised (no statistics);
            plans keep them in float32.

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
    unrecorded: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "layers", types.MappingProxyType(dict(self.layers)))
        object.__setattr__(self, "steps", int(self.steps))
        object.__setattr__(self, "unrecorded", tuple(self.unrecorded))

    def __repr__(self) -> str:
        return (
            f"Profile(model={self.model_name!r}, steps={self.steps}, layers={len(self.layers)}, "
            f"float16_unsafe={len(self.float16_unsafe_layers)})"
        )

    @property
    def suggested_loss_scale(self) -> float | None:
        """The model-wide float16 loss scale: the smallest of the layers' suggestions."""
        return self.loss_scale_for(self.layers)

    def loss_scale_for(self, paths: Iterable[str]) -> float | None:
        """The float16 loss scale of the layers at `paths`: the smallest of their suggestions."""
        layers = (self.layers.get(path) for path in paths)
        scales = (layer.suggested_loss_scale for layer in layers if layer is not None)
        return min((scale for scale in scales if scale is not None), default=None)

    @property
    def float16_unsafe_layers(self) -> tuple[str, ...]:
        """Paths of layers that are not `float16_safe`, in model order."""
        return tuple(path for path, layer in self.layers.items() if not layer.float16_safe)

    @property
    def float16_unsafe_reasons(self) -> dict[str, str]:
        """`{path: LayerProfile.float16_unsafe_reason}` of the layers that are not `float16_safe`."""
        reasons = ((path, layer.float16_unsafe_reason) for path, layer in self.layers.items())
        return {path: reason for path, reason in reasons if reason is not None}

    @property
    def float8_unsafe_layers(self) -> tuple[str, ...]:
        """Paths of the `Dense`/`EinsumDense` layers that are not `float8_safe`, in model order."""
        return tuple(path for path, layer in self.layers.items() if layer.float8_safe is False)

    @property
    def float8_unsafe_reasons(self) -> dict[str, str]:
        """`{path: LayerProfile.float8_unsafe_reason}` of the layers that are not `float8_safe`."""
        reasons = ((path, layer.float8_unsafe_reason) for path, layer in self.layers.items())
        return {path: reason for path, reason in reasons if reason is not None}

    def to_dict(self) -> dict[str, Any]:
        """Returns the JSON-ready dict written by `save`."""
        exponents = [numerics.HISTOGRAM_MIN_EXPONENT, numerics.HISTOGRAM_MAX_EXPONENT]
        return {
            "format_version": FORMAT_VERSION,
            "kind": FORMAT_KIND,
            "model_name": self.model_name,
            "fingerprint": self.fingerprint,
            "steps": self.steps,
            "histogram_exponents": exponents,
            "layers": {path: layer.to_dict() for path, layer in self.layers.items()},
            **({"unrecorded": list(self.unrecorded)} if self.unrecorded else {}),
        }

    @classmethod
    def from_dict(cls, data: object, source: str = "profile") -> Profile:
        """Builds a profile from `to_dict` output, raising `ProfileError` naming `source`."""
        mapping = require_mapping(data, source)
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
        layers_data = require_mapping(mapping.get("layers"), f"{source}: layers")
        layers = {
            path: LayerProfile.from_dict(path, value, f"{source}: layers[{path!r}]")
            for path, value in layers_data.items()
        }
        fingerprint = mapping.get("fingerprint")
        return cls(
            layers=layers,
            steps=require_count(mapping.get("steps"), f"{source}: steps"),
            model_name=str(mapping.get("model_name", "")),
            fingerprint=None if fingerprint is None else str(fingerprint),
            unrecorded=tuple(str(path) for path in mapping.get("unrecorded") or ()),
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
        """Returns a text table of the layers, riskiest for float16 first (columns in docs/api.md).

        Args:
            max_rows: show at most this many layers (all when `None`).

        Returns:
            The table as a string.
        """
        layers = list(self.layers.values())
        return views.summary_table(
            self.model_name, self.steps, self.suggested_loss_scale, layers, max_rows
        )

    def to_tensorboard(self, logdir: str | os.PathLike, step: int = 0) -> None:
        """Writes every recorded exponent histogram as a TensorBoard histogram.

        Tags are `<layer path>/<kind>[/<name>]`, the x axis `floor(log2|x|)`; needs TensorFlow.

        Args:
            logdir: TensorBoard log directory.
            step: the summary step to write at.
        """
        try:
            from .._backends import tensorflow as tensorflow_backend
        except ImportError as error:
            raise BackendError(
                "Profile.to_tensorboard writes TensorBoard event files with TensorFlow's summary "
                "writer, and TensorFlow cannot be imported in this process. Install tensorflow "
                "(tensorflow-cpu is enough), or save the profile with Profile.save(path) and call "
                "Profile.load(path).to_tensorboard(logdir) where TensorFlow is installed."
            ) from error
        tensorflow_backend.write_histograms(logdir, self._histogram_series(), step=step)

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
        """Saves a heat map of exponent histograms: layers by log2 bins, format ranges marked."""
        selections = [("forward values", "forward")] + (
            [("gradients", "gradient")] if gradients else []
        )
        panels = [
            (title, _fraction_matrix([getattr(layer, name) for layer in self.layers.values()]))
            for title, name in selections
        ]
        return views.heat_map(path, list(self.layers), panels)


def _fraction_matrix(selected: list[TensorStats | None]) -> np.ndarray:
    rows = [
        np.zeros(numerics.HISTOGRAM_BINS)
        if stats is None or stats.count == 0
        else stats.histogram / stats.count
        for stats in selected
    ]
    return np.array(rows).reshape(-1, numerics.HISTOGRAM_BINS)
