"""The layout of a profile: the names of what it holds and the read-only shapes of its values."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from .. import numerics

#: Key of a layer's single output in `LayerProfile.activations`.
OUTPUT_KEY = "output"

#: Name of the `MultiHeadAttention` internal in `LayerProfile.internals`.
ATTENTION_LOGITS = "attention_logits"

#: The recorded kinds of tensors, each a `{name: TensorStats}` field of `LayerProfile`.
TENSOR_KINDS = ("activations", "activation_gradients", "weights", "weight_gradients", "internals")

#: Key in `Profile.layers` for the weights the model owns itself (held by no layer).
ROOT_PATH = "<model>"

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


@runtime_checkable
class StatsView(Protocol):
    """The summed fields of one tensor's statistics; `TensorStats` is one."""

    @property
    def count(self) -> int: ...

    @property
    def zeros(self) -> int: ...

    @property
    def nonfinite(self) -> int: ...

    @property
    def nan(self) -> int: ...

    @property
    def max_abs(self) -> float: ...

    @property
    def min_nonzero_abs(self) -> float | None: ...

    @property
    def sum_abs(self) -> float: ...

    @property
    def sum_squares(self) -> float: ...

    @property
    def histogram(self) -> np.ndarray: ...


@runtime_checkable
class Float8RangeView(Protocol):
    """How one tensor fits its float8 format; `Float8TensorRange` is one."""

    @property
    def format(self) -> str: ...

    @property
    def amax(self) -> float: ...

    @property
    def values(self) -> int: ...

    @property
    def nonfinite(self) -> int: ...

    @property
    def flush_fraction(self) -> float: ...

    @property
    def saturation_fraction(self) -> float | None: ...

    @property
    def amax_growth(self) -> float | None: ...

    @property
    def steps(self) -> int: ...


@runtime_checkable
class Float8RangesView(Protocol):
    """The float8 ranges of one layer's recorded tensors; `Float8Ranges` is one."""

    @property
    def tensors(self) -> Mapping[str, Float8RangeView]: ...


@runtime_checkable
class LayerView(Protocol):
    """What was recorded for one layer; `LayerProfile` is one."""

    @property
    def class_name(self) -> str: ...

    @property
    def dtype(self) -> str: ...

    @property
    def activations(self) -> Mapping[str, StatsView]: ...

    @property
    def activation_gradients(self) -> Mapping[str, StatsView]: ...

    @property
    def weights(self) -> Mapping[str, StatsView]: ...

    @property
    def weight_gradients(self) -> Mapping[str, StatsView]: ...

    @property
    def internals(self) -> Mapping[str, StatsView]: ...

    @property
    def float8(self) -> Float8RangesView | None: ...


@runtime_checkable
class ProfileView(Protocol):
    """A whole profile; `Profile` is one."""

    @property
    def layers(self) -> Mapping[str, LayerView]: ...

    @property
    def steps(self) -> int: ...

    @property
    def model_name(self) -> str: ...

    @property
    def fingerprint(self) -> str | None: ...
