"""The per-model driver of cost counting: one `LayerCost` per layer of a model, from its trace."""

from __future__ import annotations

from typing import Any

import keras

from ..layers import describe_model, layer_paths
from .formulas import count_call
from .layer_cost import LayerCost
from .trace import ModelTrace, trace_model


def _merge_counts(path: str, class_name: str, counts: list[dict]) -> LayerCost:
    totals: dict[str, Any] = {}
    notes = []
    for fields in counts:
        for key, value in fields.items():
            if key == "note":
                if value:
                    notes.append(value)
            elif key in ("matmul_dims", "float8_dims"):
                totals[key] = tuple(totals.get(key, ())) + tuple(value)
            elif key == "weight_elements":
                totals[key] = max(totals.get(key, 0), int(value))
            else:
                totals[key] = totals.get(key, 0) + value
    return LayerCost(path=path, class_name=class_name, note="; ".join(sorted(set(notes))), **totals)


def count_costs(model: keras.Model, trace: ModelTrace | None = None) -> dict[str, LayerCost]:
    """Returns the per-sample FLOPs and memory traffic of every layer of `model`."""
    trace = trace or trace_model(model)
    paths = layer_paths(model)
    infos = describe_model(model)
    result: dict[str, LayerCost] = {}
    for path, layer in paths.items():
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        parent_class = type(paths[parent]).__name__ if parent in paths else ""
        counts = [
            count_call(call, layer, infos.get(path), parent_class)
            for call in trace.calls.get(path, ())
        ]
        result[path] = _merge_counts(path, type(layer).__name__, counts)
    return result
