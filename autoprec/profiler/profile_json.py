"""The profile's layout and JSON: the names of what a profile holds, and the readers that check each
JSON field, with errors naming it."""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import numerics
from ..errors import ProfileError

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

#: Version of the profile JSON format written by `Profile.save`.
FORMAT_VERSION = 1

#: The `kind` field of a profile file, which tells a profile from a plan or another JSON file.
FORMAT_KIND = "autoprec.profile"


def read_histogram(value: object, where: str) -> np.ndarray:
    histogram = np.zeros(numerics.HISTOGRAM_BINS, dtype=np.int64)
    for key, count in require_mapping(value, where).items():
        exponent = _parse_exponent(key, where)
        histogram[exponent - numerics.HISTOGRAM_MIN_EXPONENT] = require_count(
            count, f"{where}[{key!r}]"
        )
    return histogram


def require_mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ProfileError(
            f"{where}: expected a JSON object, got {type(value).__name__}; the profile is "
            "malformed. Re-create it with autoprec.profile()."
        )
    return value


def require_count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProfileError(f"{where}: expected a non-negative integer, got {value!r}.")
    return value


def require_number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProfileError(f"{where}: expected a finite number, got {value!r}.")
    return float(value)


def optional_number(value: object, where: str) -> float | None:
    return None if value is None else require_number(value, where)


def require_float8_format(value: object, where: str) -> str:
    if value not in FLOAT8_FORMAT_NAMES:
        raise ProfileError(
            f"{where}: expected one of {', '.join(FLOAT8_FORMAT_NAMES)}, got {value!r}."
        )
    return str(value)


def require_string(value: object, where: str) -> str:
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
