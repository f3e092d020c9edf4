"""The layout of a profile: the names of what it holds."""

from __future__ import annotations

import types
from collections.abc import Mapping

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
