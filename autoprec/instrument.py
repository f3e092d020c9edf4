"""What the profiler's probes and the guard's telemetry share when they wrap layer calls inside the
compiled train step: which layers are wrapped, and how a wrapped output is replaced."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras

from .layers import is_graph_model, is_pass_through, layer_paths

#: Attributes Keras hangs on tensors that a wrapped output must carry on:
#: the mask, and the logits behind a softmax/sigmoid output (the loss reads them).
KERAS_TENSOR_ATTRIBUTES = ("_keras_mask", "_keras_logits")


def instrumented_layers(
    model: keras.Model, include_pass_through: bool = False
) -> dict[str, keras.layers.Layer]:
    """Returns the layers whose calls are wrapped, by stable path (none inside an RNN's loop)."""
    paths = layer_paths(model)
    loops = tuple(
        path + "/" for path, layer in paths.items() if isinstance(layer, keras.layers.RNN)
    )
    chosen = {}
    for path, layer in paths.items():
        if type(layer).__name__ == "InputLayer" or is_graph_model(layer):
            continue
        if not include_pass_through and is_pass_through(layer):
            continue
        if loops and path.startswith(loops):
            continue
        chosen[path] = layer
    return chosen


def replace_float_outputs(
    outputs: Any, is_float: Callable[[Any], bool], replace: Callable[[tuple, Any], Any]
) -> Any:
    """Returns `outputs` with each float tensor at tree path `p` replaced by `replace(p, tensor)`."""
    flat = keras.tree.flatten_with_path(outputs)
    if not any(is_float(value) for _, value in flat):
        return outputs
    replaced = []
    for tree_path, value in flat:
        if is_float(value):
            result = replace(tree_path, value)
            for name in KERAS_TENSOR_ATTRIBUTES:  # the mask and logits Keras hung on `value`
                if getattr(value, name, None) is not None:
                    try:
                        setattr(result, name, getattr(value, name))
                    except AttributeError:  # a tensor type without a __dict__
                        pass
            value = result
        replaced.append(value)
    if len(flat) == 1 and not flat[0][0]:
        return replaced[0]
    return keras.tree.pack_sequence_as(outputs, replaced)
