"""Stable paths for every layer of any Keras model, the model fingerprint and pass-through layers."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterator

import keras

from ._core.models import ModelMemo, structure_key

#: Layer classes that move, select or combine values without arithmetic that depends on
#: precision: they take the dtype of the layer that feeds them. `Activation` counts only with a
#: piecewise-linear function (`is_pass_through`); average pooling and `Add` do arithmetic.
PASS_THROUGH_CLASSES: frozenset[str] = frozenset(
    """Activation ActivityRegularization AlphaDropout Concatenate Cropping1D Cropping2D Cropping3D
    Dropout Flatten GaussianDropout GaussianNoise GlobalMaxPooling1D GlobalMaxPooling2D
    GlobalMaxPooling3D Identity InputLayer Masking MaxPooling1D MaxPooling2D MaxPooling3D Permute
    RepeatVector Reshape SpatialDropout1D SpatialDropout2D SpatialDropout3D UpSampling1D UpSampling2D
    UpSampling3D ZeroPadding1D ZeroPadding2D ZeroPadding3D Maximum Minimum""".split()
)

_PIECEWISE_LINEAR_ACTIVATIONS = frozenset({"relu", "relu6", "linear", "leaky_relu", "hard_tanh"})

_KERAS_INTERNAL_ATTRIBUTES = frozenset(
    """_layers _tracker _inbound_nodes _outbound_nodes _operations _functional _trainable_variables
    _non_trainable_variables _seed_generators _metrics _loss_tracker""".split()
)

#: Variables Keras' float8 path adds to Dense/EinsumDense: scaling state, not the layer's
#: weights, so a plan made before float8 still fits the model after it (and the reverse).
FLOAT8_SCALING_VARIABLES = frozenset(
    """inputs_scale inputs_amax_history kernel_scale kernel_amax_history outputs_grad_scale
    outputs_grad_amax_history""".split()
)


@dataclasses.dataclass(frozen=True)
class LayerInfo:
    """What autoprec knows about one layer of a model (fields in docs/api.md)."""

    path: str
    class_name: str
    keras_path: str | None
    parameters: int
    weight_shapes: tuple[tuple[int, ...], ...]
    is_container: bool
    pass_through: bool
    follows: str | None


def is_pass_through(layer: keras.layers.Layer) -> bool:
    """Returns whether `layer` does no floating-point arithmetic worth a dtype of its own
    (`PASS_THROUGH_CLASSES`, an `Activation` only with a piecewise-linear function)."""
    class_name = type(layer).__name__
    if class_name not in PASS_THROUGH_CLASSES:
        return False
    if class_name == "Activation":
        activation = getattr(layer, "activation", None)
        name = getattr(activation, "__name__", str(activation))
        return name in _PIECEWISE_LINEAR_ACTIVATIONS
    return True


def is_graph_model(layer: keras.layers.Layer) -> bool:
    """Returns whether `layer` is a Sequential or Functional model (a graph of layers)."""
    if isinstance(layer, keras.Sequential) or type(layer).__name__ == "Functional":
        return True
    return isinstance(layer, keras.Model) and all(
        hasattr(layer, n) for n in ("_operations", "_nodes")
    )


def layer_policy(layer: keras.layers.Layer) -> keras.dtype_policies.DTypePolicy:
    """Returns the dtype policy a layer computes with, its path's entry where it holds a map (a
    float8 sub-layer of a reloaded `MultiHeadAttention` holds its container's whole map)."""
    policy = layer.dtype_policy
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
        return policy[layer.path] if layer.path else policy.default_policy
    return policy


def _own_weights(layer: keras.layers.Layer) -> list:
    scaling = (getattr(layer, name, None) for name in FLOAT8_SCALING_VARIABLES)
    excluded = {id(weight) for child in _tracked_children(layer) for weight in child.weights}
    excluded.update(id(variable) for variable in scaling if isinstance(variable, keras.Variable))
    return [weight for weight in layer.weights if id(weight) not in excluded]


def _tracked_children(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    children = getattr(layer, "_layers", [])
    return list({id(child): child for child in children if child is not layer}.values())


_AUTO_NAME = re.compile(r"^(?P<base>[a-z0-9_]+?)(?:_(?P<index>\d+))?$")


def _snake_case(name: str) -> str:
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def unprefixed_path(path: str, root: str = "") -> str:
    """Returns `path` without the names a container puts before its sub-layers' own names
    (`backbone/backbone_3_embeddings` -> `backbone/embeddings`); `root` is the model's name."""
    parent, segments = root, []
    for segment in path.split("/"):
        match = (
            re.fullmatch(rf"{re.escape(parent)}(?:_\d+)?_(?!\d+$)(.+)", segment) if parent else None
        )
        segments.append(match.group(1) if match else segment)
        parent = segment
    return "/".join(segments)


def _own_names(children: list[keras.layers.Layer], container: str) -> list[str]:
    """The children's names without `container`'s name before them, where none then collide
    (a name Keras made from the class, `prefixed_backbone` in `prefixed`, is kept)."""
    names = [child.name for child in children]
    own = [
        name if _is_auto_name(child) else unprefixed_path(name, container)
        for child, name in zip(children, names)
    ]
    return [
        mine if mine == name or (own.count(mine) == 1 and mine not in names) else name
        for name, mine in zip(names, own)
    ]


def _is_auto_name(layer: keras.layers.Layer, name: str | None = None) -> bool:
    match = _AUTO_NAME.match(name or layer.name)
    return match is not None and match.group("base") == _snake_case(type(layer).__name__)


def _local_names_for_graph_children(
    children: list[keras.layers.Layer], container: str = ""
) -> list[str]:
    """Names children of a Sequential/Functional model, renumbering auto-generated names."""
    own_names = _own_names(children, container)
    bases = [_snake_case(type(child).__name__) for child in children]
    auto = [_is_auto_name(child, name) for child, name in zip(children, own_names)]
    explicit_names = {name for name, is_auto in zip(own_names, auto) if not is_auto}
    used: set[str] = set()
    counters: dict[str, int] = {}
    names = []
    for name, base, is_auto in zip(own_names, bases, auto):
        if is_auto:
            candidate = None
            while candidate is None or candidate in explicit_names or candidate in used:
                index = counters.get(base, 0)
                counters[base] = index + 1
                candidate = base if index == 0 else f"{base}_{index}"
        else:
            candidate, suffix = name, 1
            while candidate in used:
                candidate, suffix = f"{name}_{suffix}", suffix + 1
        used.add(candidate)
        names.append(candidate)
    return names


def _attribute_children(layer: keras.layers.Layer) -> list[tuple[str, keras.layers.Layer]]:
    """Children of a non-graph layer, named by the attribute (or container slot) that holds them."""
    tracked_ids = {id(child) for child in _tracked_children(layer)}
    named: list[tuple[str, keras.layers.Layer]] = []
    seen: set[int] = set()

    def visit(name: str, value: object, depth: int) -> None:
        if depth > 3:
            return
        if isinstance(value, keras.layers.Layer):
            if id(value) in tracked_ids and id(value) not in seen and value is not layer:
                seen.add(id(value))
                named.append((name, value))
            return
        if isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                visit(f"{name}/{index}", item, depth + 1)
        elif isinstance(value, dict):
            for key, item in value.items():
                visit(f"{name}/{key}", item, depth + 1)

    for attribute, value in list(vars(layer).items()):
        if attribute in _KERAS_INTERNAL_ATTRIBUTES or attribute.startswith(("__", "_self_")):
            continue
        visit(attribute.lstrip("_") or attribute, value, 0)

    leftovers = [child for child in _tracked_children(layer) if id(child) not in seen]
    used = {name for name, _ in named}
    for child, name in zip(leftovers, _local_names_for_graph_children(leftovers, layer.name)):
        while name in used:
            name = f"{name}_"
        used.add(name)
        named.append((name, child))
    return named


def _children_with_names(layer: keras.layers.Layer) -> list[tuple[str, keras.layers.Layer]]:
    if not is_graph_model(layer):
        return _attribute_children(layer)
    if isinstance(layer, keras.Sequential):
        children = list(layer.layers)
    else:
        children = [c for c in _tracked_children(layer) if type(c).__name__ != "InputLayer"]
    # A model class that builds its own graph may name its layers after itself (keras-hub's).
    own_class = type(layer).__name__ not in ("Sequential", "Functional")
    names = _local_names_for_graph_children(children, layer.name if own_class else "")
    return list(zip(names, children))


def iter_layers(model: keras.layers.Layer) -> Iterator[tuple[str, keras.layers.Layer]]:
    """Yields `(stable_path, layer)` for every layer under `model` (not the root), parents first."""
    seen: set[int] = {id(model)}

    def walk(prefix: str, layer: keras.layers.Layer) -> Iterator[tuple[str, keras.layers.Layer]]:
        for name, child in _children_with_names(layer):
            if id(child) in seen:
                continue
            seen.add(id(child))
            path = f"{prefix}/{name}" if prefix else name
            yield path, child
            yield from walk(path, child)

    yield from walk("", model)


def layer_paths(model: keras.layers.Layer) -> dict[str, keras.layers.Layer]:
    """Returns an ordered `{stable_path: layer}` for every layer under `model`."""
    return dict(iter_layers(model))


def _graph_producers(
    container: keras.layers.Layer, path_of: dict[int, str]
) -> dict[str, str | None]:
    """For each child of a graph model, the path of the child that feeds its first input."""
    producers: dict[str, str | None] = {}
    if isinstance(container, keras.Sequential):
        previous: str | None = None
        for child in container.layers:
            producers[path_of[id(child)]] = previous
            previous = path_of[id(child)]
        return producers
    for child in _tracked_children(container):
        if id(child) in path_of:
            operations = (
                getattr(getattr(tensor, "_keras_history", None), "operation", None)
                for node in getattr(child, "_inbound_nodes", [])
                for tensor in getattr(node, "input_tensors", [])
            )
            producers[path_of[id(child)]] = next(
                (path_of[id(op)] for op in operations if op is not None and id(op) in path_of), None
            )
    return producers


#: The model descriptions read so far: one per model and structure (`DESCRIPTIONS.reads`).
DESCRIPTIONS = ModelMemo("model descriptions")


def describe_model(model: keras.layers.Layer) -> dict[str, LayerInfo]:
    """Returns `{stable_path: LayerInfo}` for every layer under `model`, in traversal order; read
    once per structure (`DESCRIPTIONS` counts reads)."""
    return dict(DESCRIPTIONS.get(model, structure_key(model), lambda: _read_description(model)))


def _read_description(model: keras.layers.Layer) -> dict[str, LayerInfo]:
    paths = layer_paths(model)
    path_of = {id(layer): path for path, layer in paths.items()}
    producers: dict[str, str | None] = {}
    for container in [model, *paths.values()]:
        if is_graph_model(container):
            producers.update(_graph_producers(container, path_of))

    infos: dict[str, LayerInfo] = {}
    previous_compute_path: dict[str, str | None] = {}
    for path, layer in paths.items():
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        pass_through = is_pass_through(layer)
        follows = producers.get(path, previous_compute_path.get(parent)) if pass_through else None
        weights = _own_weights(layer)
        infos[path] = LayerInfo(
            path=path,
            class_name=type(layer).__name__,
            keras_path=getattr(layer, "path", None),
            parameters=sum(math.prod(int(d or 0) for d in weight.shape) for weight in weights),
            weight_shapes=tuple(tuple(int(d) for d in weight.shape) for weight in weights),
            is_container=bool(_tracked_children(layer)),
            pass_through=pass_through,
            follows=follows,
        )
        previous_compute_path[parent] = path

    # Nested models follow their first computing descendant: their own policy only
    # casts their inputs, and a mismatch would add a needless cast.
    for path, layer in paths.items():
        if is_graph_model(layer):
            inside = [
                p for p, info in infos.items() if p.startswith(f"{path}/") and not info.is_container
            ]
            infos[path] = dataclasses.replace(infos[path], follows=inside[0] if inside else None)
    return infos


def model_fingerprint(model_or_infos) -> str:
    """Returns a 16-character hash of the layer paths, classes and weight shapes of a model
    (or of `describe_model` output)."""
    infos = model_or_infos if isinstance(model_or_infos, dict) else describe_model(model_or_infos)
    payload = [
        [info.path, info.class_name, [list(shape) for shape in info.weight_shapes]]
        for info in infos.values()
    ]
    digest = hashlib.sha256(json.dumps(payload, separators=(",", ":")).encode("utf-8"))
    return digest.hexdigest()[:16]


def is_fully_built(model: keras.layers.Layer) -> bool:
    """Returns whether `model` and every layer under it are built (a model with no `call` of
    its own, a GAN stepping its sub-models, counts as built once every layer under it is)."""
    layers = [layer for _, layer in iter_layers(model)]
    if not all(layer.built for layer in layers):
        return False
    if model.built:
        return True
    no_call = isinstance(model, keras.Model) and type(model).call is keras.Model.call
    return no_call and bool(layers)


def attention_logits(
    layer: keras.layers.MultiHeadAttention,
    query: object,
    key: object,
    return_attention_scores: bool = False,
) -> object | None:
    """Recomputes in float32, without gradients, the logits `MultiHeadAttention` computes in its
    dtype; `None` for a layer whose internals differ from Keras'."""
    ops = keras.ops
    if not hasattr(layer, "_inverse_sqrt_key_dim") or not hasattr(layer, "_dot_product_equation"):
        return None
    query = ops.cast(ops.stop_gradient(query), "float32")
    key = ops.cast(ops.stop_gradient(key), "float32")
    fused = not (
        getattr(layer, "_dropout", 0.0) > 0.0
        or return_attention_scores
        or len(query.shape) != 4
        or type(layer)._compute_attention is not keras.layers.MultiHeadAttention._compute_attention
    )
    if fused:  # ops.dot_product_attention multiplies before it scales
        return ops.einsum("btnh,bsnh->bnts", query, key)
    scaled_query = ops.multiply(query, layer._inverse_sqrt_key_dim)
    return ops.einsum(layer._dot_product_equation, key, scaled_query)


def observing_attention(
    layer: keras.layers.MultiHeadAttention,
    original: Callable,
    sink: Callable[[], Callable[[object], None] | None],
) -> Callable:
    """Wraps `MultiHeadAttention._compute_attention` so that `sink()`'s function sees its
    float32 logits at every trace."""

    @functools.wraps(original)
    def compute_attention(
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        **kwargs,
    ):
        observe = sink()
        if observe is not None:
            logits = attention_logits(layer, query, key, return_attention_scores)
            if logits is not None:
                observe(logits)
        return original(
            query, key, value, attention_mask, training, return_attention_scores, **kwargs
        )

    return compute_attention
