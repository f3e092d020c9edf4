"""The profile's layout and JSON: the names of what a profile holds, each value as a JSON-ready dict,
and read back with errors naming the field."""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

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

_T = TypeVar("_T")


def layer_to_dict(layer: Any) -> dict[str, Any]:
    """Returns what was recorded for one layer as a JSON-ready dict."""
    data: dict[str, Any] = {"class_name": layer.class_name, "dtype": layer.dtype}
    for kind in TENSOR_KINDS:
        data[kind] = {key: stats.to_dict() for key, stats in getattr(layer, kind).items()}
    if layer.float8 is not None:
        data["float8"] = layer.float8.to_dict()
    return data


def layer_from_dict(
    cls: type[_T],
    path: str,
    data: object,
    where: str,
    read_stats: Callable[[object, str], Any],
    read_float8: Callable[[object, str], Any],
) -> _T:
    """Builds one layer's profile from `layer_to_dict` output."""
    mapping = require_mapping(data, where)
    groups = {}
    for kind in TENSOR_KINDS:
        group = require_mapping(mapping.get(kind, {}), f"{where}.{kind}")
        groups[kind] = {
            key: read_stats(value, f"{where}.{kind}[{key!r}]") for key, value in group.items()
        }
    float8 = mapping.get("float8")
    return cls(
        path=path,
        class_name=_require_string(mapping.get("class_name"), f"{where}.class_name"),
        dtype=_require_string(mapping.get("dtype", "float32"), f"{where}.dtype"),
        float8=None if float8 is None else read_float8(float8, f"{where}.float8"),
        **groups,
    )


def profile_to_dict(profile: Any) -> dict[str, Any]:
    """Returns a whole profile as the JSON-ready dict `Profile.save` writes."""
    return {
        "format_version": FORMAT_VERSION,
        "kind": FORMAT_KIND,
        "model_name": profile.model_name,
        "fingerprint": profile.fingerprint,
        "steps": profile.steps,
        "histogram_exponents": [numerics.HISTOGRAM_MIN_EXPONENT, numerics.HISTOGRAM_MAX_EXPONENT],
        "layers": {path: layer_to_dict(layer) for path, layer in profile.layers.items()},
        **({"unrecorded": list(profile.unrecorded)} if profile.unrecorded else {}),
    }


def profile_from_dict(
    cls: type[_T],
    data: object,
    source: str,
    read_layer: Callable[[str, object, str], Any],
) -> _T:
    """Builds a whole profile from `profile_to_dict` output, raising `ProfileError` naming `source`."""
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
        path: read_layer(path, value, f"{source}: layers[{path!r}]")
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


# ----------------------------------------------------------------------------- validation


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
