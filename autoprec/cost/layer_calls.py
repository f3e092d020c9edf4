"""What one forward pass shows of a model, for counting and timing: each layer's calls (argument
shapes, outputs), the tensors between layers, and random arguments shaped like a recorded call."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import keras
import numpy as np

from .._backends import timing_backend
from .._core.data import flat_arrays, is_array, slice_batch
from .._core.models import ModelMemo, structure_key, swap_attribute
from ..errors import BackendError, PlanError
from ..layers import layer_paths, layer_policy

#: The forward passes traced so far: one per model, policies and batch signature.
TRACES = ModelMemo("model traces")

_CAPTURE_BATCH = 2

#: What `LayerCall.arguments` holds for an argument it cannot describe (neither tensors, nested
#: in lists and dicts, nor a plain scalar); `synthetic_arguments` refuses it.
UNSUPPORTED_ARGUMENT = "<unsupported argument>"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape (batch dimension `None`) and dtype of one tensor a layer received or returned."""

    shape: tuple[int | None, ...]
    dtype: str
    name: str = dataclasses.field(default="", compare=False)

    def elements_per_sample(self) -> int:
        """Returns the number of elements per sample (batch dimension counted as 1)."""
        return element_count(1 if dim is None else dim for dim in self.shape[1:])

    def concrete_shape(self, batch_size: int) -> tuple[int, ...]:
        """Returns the shape with the batch dimension set to `batch_size`."""
        if not self.shape:
            return ()
        rest = tuple(1 if dim is None else int(dim) for dim in self.shape[1:])
        return (batch_size, *rest)

    def to_json(self) -> list:
        """Returns `[shape, dtype]`, JSON-serialisable (`None` for the batch dimension)."""
        return [list(self.shape), self.dtype]


@dataclasses.dataclass(frozen=True)
class MappingArgument:
    """A dict argument of a layer call: each key with its recorded value, in order."""

    items: tuple[tuple[str, ArgumentValue], ...]


#: One recorded call argument: a tensor, a list (recorded as a tuple) or a dict of
#: recorded values, nested in any way, or a plain Python value.
ArgumentValue: TypeAlias = (
    TensorSpec | tuple["ArgumentValue", ...] | MappingArgument | bool | int | float | str | None
)


def _tensor_specs(value: ArgumentValue) -> list[TensorSpec]:
    """Returns every `TensorSpec` in a recorded value, in order."""
    if isinstance(value, TensorSpec):
        return [value]
    if isinstance(value, MappingArgument):
        return [spec for _, item in value.items for spec in _tensor_specs(item)]
    if isinstance(value, tuple):
        return [spec for item in value for spec in _tensor_specs(item)]
    return []


@dataclasses.dataclass(frozen=True)
class LayerCall:
    """What one call of a layer received and returned."""

    path: str
    class_name: str
    arguments: tuple[tuple[str, ArgumentValue], ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """Every tensor argument, flattened in argument order."""
        return tuple(spec for _, value in self.arguments for spec in _tensor_specs(value))

    def argument(self, *names: str) -> TensorSpec | None:
        """Returns the first tensor argument called one of `names`, or `None`."""
        for name, value in self.arguments:
            if name in names and isinstance(value, TensorSpec):
                return value
        return None

    def signature(self) -> list:
        """Returns a JSON-serialisable description of the arguments (for cache keys)."""

        def encode(value: ArgumentValue) -> dict[str, Any]:
            if isinstance(value, TensorSpec):
                return {"tensor": value.to_json()}
            if isinstance(value, tuple):
                return {"list": [encode(item) for item in value]}
            if isinstance(value, MappingArgument):
                return {"dict": [[key, encode(item)] for key, item in value.items]}
            return {"value": value}

        return [[name, encode(value)] for name, value in self.arguments]


@dataclasses.dataclass(frozen=True)
class Edge:
    """A tensor passed from one layer to another (`producer` `None`: a model input)."""

    producer: str | None
    consumer: str
    elements_per_sample: int


@dataclasses.dataclass(frozen=True)
class ModelTrace:
    """Shapes every layer saw in one forward pass, and the tensors passed between layers."""

    calls: dict[str, tuple[LayerCall, ...]]
    edges: tuple[Edge, ...]


def element_count(values) -> int:
    return math.prod(int(value) for value in values)


def spec_of(tensor: Any) -> TensorSpec:
    """Returns the `TensorSpec` of an array, tensor or symbolic tensor (batch dimension `None`)."""
    shape = tuple(int(dim) if dim is not None else None for dim in tensor.shape)
    if shape:
        shape = (None, *shape[1:])
    return TensorSpec(shape, keras.backend.standardize_dtype(tensor.dtype))


def _encode_argument(value: Any) -> ArgumentValue:
    if is_array(value):
        return spec_of(value)
    if isinstance(value, (list, tuple, Mapping)) and flat_arrays(value):
        if isinstance(value, Mapping):
            if not all(isinstance(key, str) for key in value):
                return UNSUPPORTED_ARGUMENT
            items = tuple((key, _encode_argument(item)) for key, item in value.items())
            encoded: ArgumentValue = MappingArgument(items)
            values = [item for _, item in items]
        else:
            encoded = tuple(_encode_argument(item) for item in value)
            values = list(encoded)
        return UNSUPPORTED_ARGUMENT if UNSUPPORTED_ARGUMENT in values else encoded
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return UNSUPPORTED_ARGUMENT


def random_inputs(
    specs: Any, batch_size: int, seed: int = 0, unknown_length: int | None = None
) -> Any:
    """Returns random NumPy arrays of `batch_size` samples in the structure of `specs`."""
    rng = np.random.default_rng(seed)
    arrays = []
    for path, spec in keras.tree.flatten_with_path(specs):
        if unknown_length is not None:
            known = tuple(unknown_length if dim is None else dim for dim in spec.shape[1:])
            spec = dataclasses.replace(spec, shape=(None, *known) if spec.shape else ())
        if any(dim is None for dim in spec.shape[1:]):
            # How a user reaches the array: `x["text"]["tokens"]`, `x[0]`.
            keys = "".join(f'["{key}"]' if isinstance(key, str) else f"[{key}]" for key in path)
            name = spec.name or f"x{keys}"
            raise PlanError(
                f"model input {name!r} has unknown dimensions {tuple(spec.shape)}; "
                "pass a batch of inputs (`x=...`) as fit feeds them, whose shapes are timed."
            )
        shape = spec.concrete_shape(batch_size)
        if spec.dtype == "bool":
            arrays.append(np.ones(shape, dtype="bool"))
        elif "float" not in spec.dtype:
            arrays.append(np.zeros(shape, dtype=spec.dtype))
        else:
            arrays.append(rng.standard_normal(shape).astype(spec.dtype))
    return keras.tree.pack_sequence_as(specs, arrays)


def _symbolic_inputs(model: keras.Model) -> Any:
    """Returns the model's symbolic inputs in the structure it takes them, or `None`."""
    with contextlib.suppress(AttributeError, ValueError):
        return model.input
    with contextlib.suppress(AttributeError, ValueError):
        symbolic = model.inputs
        if symbolic:
            return symbolic[0] if len(symbolic) == 1 else list(symbolic)
    return None


def sample_inputs(
    model: keras.Model, batch_size: int = _CAPTURE_BATCH, unknown_length: int | None = None
) -> Any:
    """Returns random inputs of `batch_size` samples matching a built model's inputs."""
    symbolic = _symbolic_inputs(model)
    if symbolic is None or not keras.tree.flatten(symbolic):
        raise PlanError(
            f"model {model.name!r} has no symbolic inputs (subclassed or unbuilt); "
            "pass a batch of inputs (`x=...`)."
        )
    specs = keras.tree.map_structure(
        lambda tensor: dataclasses.replace(spec_of(tensor), name=getattr(tensor, "name", "")),
        symbolic,
    )
    return random_inputs(specs, batch_size, unknown_length=unknown_length)


class _Recorder:
    """Temporary hooks on every layer's call and on Keras' input casts, recording shapes and edges."""

    def __init__(self, paths: dict[str, keras.layers.Layer]):
        self.paths = paths
        self.calls: dict[str, list[LayerCall]] = {path: [] for path in paths}
        self.producer_of: dict[int, str] = {}
        self.source_of: dict[int, int] = {}
        self.raw_edges: list[tuple[int, str | None, str, int]] = []
        self.keep_alive: list[Any] = []
        self.undo: list[Callable[[], None]] = []

    def install(self) -> None:
        for path, layer in self.paths.items():
            quantized = getattr(getattr(layer, "dtype_policy", None), "quantization_mode", None)
            name = "quantized_call" if quantized else "call"
            hook = self._hook(path, layer, getattr(layer, name), layer.call)
            self.undo.append(swap_attribute(layer, name, hook))
        convert_input = keras.DTypePolicy.convert_input

        def converted(policy, x, autocast, dtype):
            result = convert_input(policy, x, autocast, dtype)
            if result is not x:
                self.source_of[id(result)] = self.source_of.get(id(x), id(x))
                self.keep_alive.extend((x, result))
            return result

        self.undo.append(swap_attribute(keras.DTypePolicy, "convert_input", converted))

    def remove(self) -> None:
        for undo in reversed(self.undo):
            undo()
        self.undo.clear()
        self.keep_alive.clear()

    def _hook(self, path: str, layer: keras.layers.Layer, original, described):
        signature = None
        with contextlib.suppress(TypeError, ValueError):
            signature = inspect.signature(described)

        def hooked(*args, **kwargs):
            outputs = original(*args, **kwargs)
            self._record(path, layer, signature, args, kwargs, outputs)
            return outputs

        return hooked

    def _record(self, path, layer, signature, args, kwargs, outputs) -> None:
        arguments: list[tuple[str, Any]] = []
        named = [(f"arg{index}", value) for index, value in enumerate(args)] + list(kwargs.items())
        if signature is not None:
            with contextlib.suppress(TypeError):
                named = list(signature.bind_partial(*args, **kwargs).arguments.items())
        for name, value in named:
            if name == "training":
                continue
            if signature is not None and name in signature.parameters:
                kind = signature.parameters[name].kind
                if kind == inspect.Parameter.VAR_KEYWORD and isinstance(value, Mapping):
                    arguments.extend((key, _encode_argument(item)) for key, item in value.items())
                    continue
                if kind == inspect.Parameter.VAR_POSITIONAL:
                    value = tuple(value)
            arguments.append((name, _encode_argument(value)))
        inputs, output_tensors = flat_arrays((args, kwargs)), flat_arrays(outputs)
        output_specs = tuple(spec_of(tensor) for tensor in output_tensors)
        self.calls[path].append(
            LayerCall(path, type(layer).__name__, tuple(arguments), output_specs)
        )
        for tensor in inputs:
            tensor_id = self.source_of.get(id(tensor), id(tensor))
            elements = spec_of(tensor).elements_per_sample()
            self.raw_edges.append((tensor_id, self.producer_of.get(tensor_id), path, elements))
        for tensor in output_tensors:
            self.producer_of.setdefault(id(tensor), path)
        self.keep_alive.extend((*output_tensors, *inputs))


def _prune_edges(
    raw_edges: list[tuple[int, str | None, str, int]], input_ids: set[int]
) -> tuple[Edge, ...]:
    """Drops edges into containers whose descendants consume the same tensor, and self-loops."""
    consumers_of: dict[int, set[str]] = {}
    for tensor_id, _, consumer, _ in raw_edges:
        consumers_of.setdefault(tensor_id, set()).add(consumer)
    edges: dict[tuple[str | None, str, int], Edge] = {}  # the first edge of each tensor and pair
    for tensor_id, producer, consumer, elements in raw_edges:
        if producer is None and tensor_id not in input_ids:
            continue
        if producer is not None and (producer == consumer or producer.startswith(consumer + "/")):
            continue
        if any(other.startswith(consumer + "/") for other in consumers_of[tensor_id]):
            continue
        edges.setdefault((producer, consumer, tensor_id), Edge(producer, consumer, elements))
    return tuple(edges.values())


def trace_model(model: keras.Model, sample: Any = None) -> ModelTrace:
    """Runs one inference forward pass with temporary hooks and records every layer's shapes."""
    paths = layer_paths(model)
    key = (
        structure_key(model),
        tuple(layer_policy(layer).name for layer in paths.values()),
        None if sample is None else batch_signature(sample),
    )
    return TRACES.get(model, key, lambda: _read_trace(model, sample, paths))


def batch_signature(batch: Any) -> tuple:
    """Returns what a trace depends on in a batch: each array's shape besides the batch, and dtype."""
    signature = []
    for leaf in keras.tree.flatten(batch):
        if is_array(leaf):
            shape = tuple(None if dim is None else int(dim) for dim in tuple(leaf.shape)[1:])
            signature.append((shape, keras.backend.standardize_dtype(leaf.dtype)))
        else:
            signature.append((type(leaf).__name__, repr(leaf)))
    return tuple(signature)


def _read_trace(
    model: keras.Model, sample: Any, paths: dict[str, keras.layers.Layer]
) -> ModelTrace:
    inputs = sample_inputs(model) if sample is None else slice_batch(sample, _CAPTURE_BATCH)
    inputs = keras.tree.map_structure(
        lambda value: (
            keras.ops.convert_to_tensor(value) if isinstance(value, np.ndarray) else value
        ),
        inputs,
    )
    recorder = _Recorder(paths)
    recorder.install()
    try:
        model(inputs, training=False)
        edges = _prune_edges(recorder.raw_edges, {id(tensor) for tensor in flat_arrays(inputs)})
    finally:
        recorder.remove()
    return ModelTrace(
        calls={path: tuple(calls) for path, calls in recorder.calls.items()}, edges=edges
    )


def synthetic_tensor(
    spec: TensorSpec,
    batch_size: int,
    dtype: str,
    rng: np.random.Generator,
    value_range: tuple[float, float] | None = None,
) -> Any:
    """Returns a backend tensor shaped like `spec` at `batch_size`: random floats in `dtype`
    (standard-normal, or uniform in `value_range`), all-`True` booleans, zero integers."""
    shape = spec.concrete_shape(batch_size)
    if spec.dtype == "bool":
        return keras.ops.ones(shape, dtype="bool")
    if "float" not in spec.dtype:
        return keras.ops.zeros(shape, dtype=spec.dtype)
    if value_range is None:
        with contextlib.suppress(BackendError):  # a backend without timing: NumPy values
            return timing_backend("synthetic_tensor()").random_tensor(shape, dtype, rng)
        values = rng.standard_normal(shape).astype("float32")
    else:
        values = rng.uniform(value_range[0], value_range[1], size=shape).astype("float32")
    return keras.ops.cast(keras.ops.convert_to_tensor(values), dtype)


def synthetic_arguments(
    call: LayerCall,
    batch_size: int,
    dtype: str,
    rng: np.random.Generator,
    value_range: tuple[float, float] | None = None,
) -> tuple[list, dict]:
    """Returns `(args, kwargs)` that call a layer as `call` recorded, with `synthetic_tensor`s;
    raises `BackendError` naming an argument the trace could not describe."""

    def build(value: ArgumentValue) -> Any:
        if isinstance(value, TensorSpec):
            return synthetic_tensor(value, batch_size, dtype, rng, value_range)
        if isinstance(value, tuple):
            return [build(item) for item in value]
        if isinstance(value, MappingArgument):
            return {key: build(item) for key, item in value.items}
        return value

    args: list = []
    kwargs: dict = {}
    for index, (name, value) in enumerate(call.arguments):
        if value == UNSUPPORTED_ARGUMENT:
            raise BackendError(f"argument {name!r} of {call.path} cannot be rebuilt")
        built = build(value)
        if index == 0:
            args.append(built)
        elif value is not None:
            kwargs[name] = built
    return args, kwargs
