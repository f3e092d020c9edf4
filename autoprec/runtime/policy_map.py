"""Per-layer dtypes as Keras rebuilds them: a `DTypePolicyMap` in the config of a container that
builds its own sub-layers, and graph constants in the dtype of the operand they were made from."""

from __future__ import annotations

import collections
import re
import weakref
from collections.abc import Mapping
from typing import Any

import keras
from keras.src.backend.common.name_scope import current_path

from .._core.models import call_model_code
from ..layers import is_graph_model, layer_paths, layer_policy, unprefixed_path

#: Marks a container whose `get_config` already writes the model's policy map.
_WRITES_MAP = "_autoprec_writes_policy_map"
#: Non-empty while `_rebuilt_apart` reads containers' configs (no policy map is written then).
_READING_CONFIGS: list[bool] = []


def _entry_of(layer: keras.layers.Layer) -> keras.dtype_policies.DTypePolicy:
    """The policy `layer` computes with: its entry of a map before it builds too (Keras sets
    `layer.path` as it builds, after the first call cast its inputs to the map's default)."""
    policy, path = layer._dtype_policy, layer.path
    if not isinstance(policy, keras.dtype_policies.DTypePolicyMap):
        return policy
    if not path:  # where its name scope puts it: its parent's, once that scope opened
        parent = getattr(layer, "_parent_path", None)
        parent = current_path() if parent is None else parent
        path = f"{parent}/{layer.name}" if parent else layer.name
    return policy[path]


# Keras' `Layer.compute_dtype`, `variable_dtype` and `quantization_mode` with that lookup.
for _name in ("compute_dtype", "variable_dtype", "quantization_mode"):
    setattr(keras.layers.Layer, _name, property(lambda self, n=_name: getattr(_entry_of(self), n)))


def policy_map_of(
    model: keras.layers.Layer, default: keras.dtype_policies.DTypePolicy
) -> keras.dtype_policies.DTypePolicyMap:
    """Returns a `DTypePolicyMap` of every built layer under `model`, keyed by Keras' layer path."""
    layers: dict[str, keras.layers.Layer] = {}
    paths = layer_paths(model)
    for layer in [model, *paths.values()]:
        if layer.path and layer.path not in layers:
            layers[layer.path] = layer
    entries = {path: layer_policy(layer) for path, layer in layers.items()}
    # The container a Keras path's first segment leaves out (it may put its name before).
    containers = {
        layer.path: paths[path.rpartition("/")[0]].name
        for path, layer in paths.items()
        if "/" in path and layer.path and "/" not in layer.path
    }
    return keras.dtype_policies.DTypePolicyMap(
        default_policy=default, policy_map=name_patterns(entries, layers, containers)
    )


def name_patterns(
    entries: Mapping[str, Any],
    layers: Mapping[str, keras.layers.Layer],
    containers: Mapping[str, str],
) -> dict[str, Any]:
    r"""Returns `entries` keyed by patterns that also match a Keras-made name's other numbers and
    a container's name put before a sub-layer's (`containers`: Keras path -> container name)."""
    apart = _rebuilt_apart(layers)
    keyed: dict[str, Any] = {}
    for open_names in (True, False):  # Keras-made names open to any number, else as they are
        patterns = {
            path: _path_pattern(
                path, layers, apart, open_names, containers.get(path.split("/")[0], "")
            )
            for path in entries
            if path not in keyed.values()
        }
        for path, pattern in patterns.items():
            if pattern is not None and (
                [other for other in layers if re.fullmatch(pattern, other)] == [path]
                and list(patterns.values()).count(pattern) == 1
            ):
                keyed[pattern] = path
    done = set(keyed.values())
    keyed.update({re.escape(path): path for path in entries if path not in done})
    # Anchored: Keras 3.10 matches a key with `re.search`, later versions in full.
    return {f"^{pattern}$": entries[path] for pattern, path in keyed.items()}


def _rebuilt_apart(layers: Mapping[str, keras.layers.Layer]) -> set[str]:
    """Paths of layers their container rebuilds from a config of their own (a wrapped layer)."""
    apart = set()
    inner_names: dict[str, set[str]] = {}  # container path -> names its own config holds
    for path, layer in layers.items():
        container_path = path.rpartition("/")[0]
        container = layers.get(container_path) if "/" in path else None
        if container is None or is_graph_model(container):
            continue
        if "/" not in container_path and isinstance(container, keras.Model):
            apart.add(path)  # a subclassed model's layers reload outside its name scope
            continue
        if container_path not in inner_names:
            inner_names[container_path] = _names_in_config(container)
        if layer.name in inner_names[container_path]:
            apart.add(path)
    return apart


def _names_in_config(container: keras.layers.Layer) -> set[str]:
    """The names of the layers `container`'s own config holds whole (read once, with no map)."""
    _READING_CONFIGS.append(True)  # inner configs are read plain: no map inside a map
    try:
        config = own_config(container, type(container).get_config) or {}
    finally:
        _READING_CONFIGS.pop()
    return {
        value["config"].get("name")
        for value in config.values()
        if isinstance(value, dict) and isinstance(value.get("config"), dict)
    }


def _path_pattern(
    path: str,
    layers: Mapping[str, keras.layers.Layer],
    apart: set[str] = frozenset(),
    open_names: bool = True,
    container: str = "",
) -> str | None:
    """`path` as a regular expression, each Keras-made name open to any number; `None` if none."""
    segments = path.split("/")
    parts = []
    optional_until = max(
        (index for index in range(1, len(segments)) if "/".join(segments[: index + 1]) in apart),
        default=0,
    )
    for index, segment in enumerate(segments):
        layer = layers.get("/".join(segments[: index + 1]))
        stem = _snake_case(type(layer).__name__) if layer is not None else None
        parent = re.sub(r"_\d+$", "", segments[index - 1] if index else container)
        own = unprefixed_path(segment, parent) if parent else segment
        # A container may put its own name before its sub-layers' (keras-hub's DINOV2Backbone).
        prefix = rf"(?:{re.escape(parent)}(?:_\d+)?_)?" if parent else ""
        if open_names and stem and re.fullmatch(rf"{re.escape(stem)}(?:_\d+)?", own):
            parts.append(rf"{prefix}{re.escape(stem)}(?:_\d+)?")
        else:
            parts.append(prefix + re.escape(own))
    pattern = "/".join(parts)
    if optional_until:
        pattern = f"(?:{'/'.join(parts[:optional_until])}/)?{'/'.join(parts[optional_until:])}"
    return pattern if pattern != re.escape(path) else None


def _snake_case(name: str) -> str:
    """Keras' instance name for a class (`MixtralSparseMoeBlock`: `mixtral_sparse_moe_block`)."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def map_groups(model: keras.Model) -> dict[str, list[str]]:
    """Returns, for each outermost container that builds its own sub-layers, the paths under it."""
    paths = {"": model, **layer_paths(model)}
    owners = [path for path, layer in paths.items() if _builds_own_sub_layers(layer, path, paths)]
    groups: dict[str, list[str]] = {}
    for owner in owners:
        if any(owner != other and _is_under(owner, other) for other in owners):
            continue
        groups[owner] = [path for path in paths if path != owner and _is_under(path, owner)]
    return groups


def unnamed_layer_dtypes(model: keras.Model, dtypes: Mapping[str, str]) -> dict[str, str]:
    """Returns the dtype each layer Keras leaves without a path takes from its policy map."""
    paths = {"": model, **layer_paths(model)}
    changed: dict[str, str] = {}
    for members in map_groups(model).values():
        unnamed = [
            path
            for path in members
            if not paths[path].path
            and dtypes.get(path) in ("float32", "bfloat16", "float16")
            and skip_reason(paths[path]) is None
        ]
        counts = collections.Counter(dtypes[path] for path in unnamed)
        if counts:
            default = counts.most_common(1)[0][0]
            changed.update({path: default for path in unnamed if dtypes[path] != default})
    return changed


def skip_reason(layer: keras.layers.Layer) -> str | None:
    """Why a plan leaves `layer`'s policy as it is (quantized, or not floating point), or `None`."""
    policy = layer_policy(layer)
    if getattr(policy, "quantization_mode", None) not in (None, "float8"):
        return f"quantized ({policy.quantization_mode}); its policy is left as it is"
    compute_dtype = str(getattr(policy, "compute_dtype", ""))
    if compute_dtype and not keras.backend.is_float_dtype(compute_dtype):
        return f"computes in {compute_dtype}, not floating point"
    return None


def write_nested_policies(model: keras.Model) -> int:
    """Makes every container that builds its own sub-layers save their policies in its config."""
    root = weakref.ref(model)
    paths = {"": model, **layer_paths(model)}
    writing = 0
    for owner, members in map_groups(model).items():
        for path in [owner, *members]:
            layer = paths[path]
            if not getattr(layer, _WRITES_MAP, False):
                if not _builds_own_sub_layers(layer, path, paths):
                    continue
                writer = _config_with_map(layer, layer.get_config, root, owner)
                object.__setattr__(layer, "get_config", writer)
                object.__setattr__(layer, _WRITES_MAP, True)
            writing += 1
    return writing


def _config_with_map(layer: keras.layers.Layer, own_get_config, root: weakref.ref, owner: str):
    def get_config():
        config = own_get_config()
        model = root()
        if model is None or "dtype" not in config or _READING_CONFIGS:
            return config
        policy_map = policy_map_of(model, default=_group_default(model, owner, layer))
        return {**config, "dtype": keras.dtype_policies.serialize(policy_map)}

    return get_config


def _group_default(model: keras.Model, owner: str, layer: keras.layers.Layer):
    """The policy most of the group's nameless layers have, else `layer`'s own."""
    policies = [
        layer_policy(member)
        for path, member in layer_paths(model).items()
        if _is_under(path, owner) and not member.path
    ]
    if not policies:
        return layer_policy(layer)
    name = collections.Counter(policy.name for policy in policies).most_common(1)[0][0]
    return next(policy for policy in policies if policy.name == name)


def _is_under(path: str, container: str) -> bool:
    return not container or path.startswith(container + "/")


def lists_own_layers(layer: keras.layers.Layer) -> bool:
    """Returns whether `layer` is a Sequential or functional model whose config lists its layers."""
    if not is_graph_model(layer):
        return False
    config = own_config(layer, type(layer).get_config)
    return config is None or "layers" in config


def own_config(layer: keras.layers.Layer, get_config) -> dict | None:
    """Returns `get_config(layer)`, or `None` (a warning unless the layer has no config)."""

    def read() -> dict | None:
        try:
            return get_config(layer)
        except NotImplementedError:  # a layer without a config of its own: nothing lost here
            return None

    lost = "Keras cannot save this model (its config cannot be read)"
    return call_model_code(read, layer=layer.name, lost=lost, fallback=None)


def _builds_own_sub_layers(layer: keras.layers.Layer, path: str, paths: dict) -> bool:
    """Whether `layer` owns sub-layers its config does not describe one by one."""
    prefix = f"{path}/" if path else ""
    if not any(other.startswith(prefix) and other != path for other in paths):
        return False
    # A functional model's config lists its layers, each with its own dtype, unless its
    # class writes a config of its own (a keras-hub backbone does).
    return not lists_own_layers(layer)


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
