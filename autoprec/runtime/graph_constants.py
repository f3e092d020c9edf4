"""Constants a graph made in its operand's dtype, made again in the dtype that operand has now."""

from __future__ import annotations

import weakref

import keras

from ..layers import is_graph_model, layer_paths
from .policy_map import lists_own_layers

#: `{node: its arguments as the graph was built}` of the nodes whose constants were cast.
_BUILT_ARGUMENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def align_graph_constants(model: keras.Model) -> int:
    """Makes each graph constant made from an operand's dtype again in that operand's dtype now."""
    changed = 0
    for graph in [model, *layer_paths(model).values()]:
        if not is_graph_model(graph) or lists_own_layers(graph):
            continue
        for nodes in getattr(graph, "_nodes_by_depth", {}).values():  # Keras' graph of nodes
            for node in nodes:
                changed += _align_node(node)
    return changed


def _align_node(node: object) -> int:
    """Casts one operation's constants where their operand's producer computes in another dtype."""
    operation = getattr(node, "operation", None)
    if operation is None or isinstance(operation, keras.layers.Layer):
        return 0  # a layer casts its own inputs
    built = _BUILT_ARGUMENTS.get(node, node.arguments)
    operands = [tensor for tensor in built.keras_tensors if _producer_dtype(tensor)]
    if not operands:
        return 0
    casts = {}
    for operand in operands:
        built_dtype = keras.backend.standardize_dtype(operand.dtype)
        now = _producer_dtype(operand)
        if now != built_dtype:
            casts[built_dtype] = now
    cast_count = []

    def cast(value: object) -> object:
        if isinstance(value, keras.KerasTensor) or not keras.ops.is_tensor(value):
            return value
        dtype = keras.backend.standardize_dtype(value.dtype)
        if dtype not in casts:
            return value
        cast_count.append(dtype)
        return keras.ops.cast(value, casts[dtype])

    args, kwargs = built.convert(cast)
    if not cast_count:
        if node in _BUILT_ARGUMENTS:
            node.arguments = _BUILT_ARGUMENTS.pop(node)  # the graph as it was built
        return 0
    _BUILT_ARGUMENTS[node] = built
    node.arguments = type(built)(*args, **kwargs)
    return 1


def _producer_dtype(tensor: keras.KerasTensor) -> str | None:
    """The compute dtype of the layer that makes `tensor` in the graph; `None` for an operation."""
    history = getattr(tensor, "_keras_history", None)
    producer = getattr(history, "operation", None)
    if not isinstance(producer, keras.layers.Layer) or isinstance(
        producer, keras.layers.InputLayer
    ):
        return None
    dtype = keras.backend.standardize_dtype(producer.compute_dtype)
    return dtype if keras.backend.is_float_dtype(dtype) else None
