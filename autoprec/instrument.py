"""What the profiler's probes and the guard's telemetry share when they wrap layer calls inside the
compiled train step: which layers are wrapped, and what a wrapped output carries on."""

from __future__ import annotations

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


def copy_keras_attributes(source: object, target: object) -> None:
    """Copies the mask and logits Keras hung on `source` onto `target`."""
    for name in KERAS_TENSOR_ATTRIBUTES:
        value = getattr(source, name, None)
        if value is not None:
            try:
                setattr(target, name, value)
            except AttributeError:  # a tensor type without a __dict__
                pass
