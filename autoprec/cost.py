"""What each layer costs in each dtype: FLOP/byte counts, roofline predictions and measurements.

Three steps, each usable alone:

* `trace_model(model)` runs one small forward pass with temporary hooks on every
  layer's `call` and records the shapes each layer sees and which layer feeds
  which (`ModelTrace`);
* `count_costs(model)` turns those shapes into forward/backward FLOPs and bytes
  (`LayerCost`), and `predict_costs(model, hardware, batch_size)` turns counts
  into seconds with a roofline model of a `HardwareProfile`;
* `calibrate(model, batch)` measures each layer's forward+backward time in each
  dtype on this device instead (cached; on the TensorFlow or JAX backend, JAX
  timing in `autoprec._backends.jax`), plus the cost of casts and whole-model
  steps under uniform policies (float32 and each 16-bit dtype the device runs
  fast): what the summed layers miss becomes a fixed per-step overhead shared by
  all dtypes and a per-dtype scale of layer times, so that a uniform plan's
  estimate equals its measured step.

Both give a `CostTable`; `estimate(model, plan, costs_or_hardware)` sums it for a
plan: step time, speedup over float32, memory and the largest batch that fits.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import os
import re
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np

from . import hardware as hardware_module
from ._core.dtypes import COMPUTE_DTYPES, FLOAT32, POLICY_FOR_DTYPE, canonical_dtype
from ._core.io import atomic_write_json, read_json_file
from .errors import BackendError, HardwareError, PlanError
from .layers import LayerInfo, describe_model, layer_paths, model_fingerprint

_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
_CAPTURE_BATCH = 2
_TABLE_FORMAT = 1
_CACHE_FORMAT = 1

#: Fraction of peak FLOP/s a matmul/conv reaches in the roofline prediction.
MATMUL_EFFICIENCY = 0.6
#: Fraction of float32 peak that vector (elementwise) arithmetic reaches.
VECTOR_EFFICIENCY = 0.25
#: Fraction of device memory a step may fill (the rest: framework, workspaces).
USABLE_MEMORY_FRACTION = 0.9

#: FLOPs per element of common activations (forward).
ACTIVATION_FLOPS: dict[str, int] = {
    "linear": 0,
    "relu": 1,
    "relu6": 2,
    "leaky_relu": 2,
    "hard_tanh": 2,
    "elu": 4,
    "selu": 5,
    "celu": 5,
    "sigmoid": 4,
    "hard_sigmoid": 3,
    "tanh": 4,
    "softplus": 4,
    "softsign": 3,
    "silu": 5,
    "swish": 5,
    "hard_silu": 5,
    "hard_swish": 5,
    "gelu": 8,
    "mish": 8,
    "exponential": 1,
    "log_sigmoid": 5,
    "softmax": 5,
    "log_softmax": 5,
}
_DEFAULT_ACTIVATION_FLOPS = 4

_VIEW_CLASSES = frozenset({"Flatten", "Reshape", "InputLayer", "Identity"})
_COPY_CLASSES = frozenset(
    {
        "Concatenate",
        "Permute",
        "RepeatVector",
        "ZeroPadding1D",
        "ZeroPadding2D",
        "ZeroPadding3D",
        "Cropping1D",
        "Cropping2D",
        "Cropping3D",
        "UpSampling1D",
        "UpSampling2D",
        "UpSampling3D",
        "Masking",
        "ActivityRegularization",
    }
)
_MERGE_CLASSES = frozenset({"Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum"})
_DROPOUT_CLASSES = frozenset(
    {
        "Dropout",
        "SpatialDropout1D",
        "SpatialDropout2D",
        "SpatialDropout3D",
        "GaussianDropout",
        "GaussianNoise",
        "AlphaDropout",
    }
)
_NORMALISATION_CLASSES = frozenset(
    {
        "BatchNormalization",
        "LayerNormalization",
        "GroupNormalization",
        "UnitNormalization",
        "RMSNormalization",
        "SpectralNormalization",
    }
)
_RNN_GATES = {"LSTM": 4, "GRU": 3, "SimpleRNN": 1, "ConvLSTM1D": 4, "ConvLSTM2D": 4}
_RNN_VECTOR_FLOPS_PER_UNIT = {"LSTM": 10, "GRU": 9, "SimpleRNN": 2}


# =========================================================================== tracing


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape (batch dimension `None`) and dtype of one tensor a layer received or returned."""

    shape: tuple[int | None, ...]
    dtype: str

    def elements_per_sample(self) -> int:
        """Returns the number of elements per sample (batch dimension counted as 1)."""
        return _product(1 if dim is None else dim for dim in self.shape[1:])

    def concrete_shape(self, batch_size: int) -> tuple[int, ...]:
        """Returns the shape with the batch dimension set to `batch_size`."""
        if not self.shape:
            return ()
        rest = tuple(1 if dim is None else int(dim) for dim in self.shape[1:])
        return (batch_size, *rest)

    def to_json(self) -> list:
        return [list(self.shape), self.dtype]


@dataclasses.dataclass(frozen=True)
class LayerCall:
    """What one call of a layer received and returned.

    Attributes:
        path: stable path of the layer.
        class_name: the layer's class name.
        arguments: call arguments in order as `(name, value)`; a value is a
            `TensorSpec`, a tuple of `TensorSpec` (list arguments) or a plain
            Python scalar.
        outputs: every tensor the call returned, flattened.
    """

    path: str
    class_name: str
    arguments: tuple[tuple[str, Any], ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """Every tensor argument, flattened in argument order."""
        flat: list[TensorSpec] = []
        for _, value in self.arguments:
            if isinstance(value, TensorSpec):
                flat.append(value)
            elif isinstance(value, tuple):
                flat.extend(item for item in value if isinstance(item, TensorSpec))
        return tuple(flat)

    def argument(self, *names: str) -> TensorSpec | None:
        """Returns the first tensor argument called one of `names`, or `None`."""
        for name, value in self.arguments:
            if name in names and isinstance(value, TensorSpec):
                return value
        return None

    def signature(self) -> list:
        """Returns a JSON-serialisable description of the arguments (for cache keys)."""

        def encode(value: Any) -> Any:
            if isinstance(value, TensorSpec):
                return {"tensor": value.to_json()}
            if isinstance(value, tuple):
                return {"list": [encode(item) for item in value]}
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


def _product(values) -> int:
    result = 1
    for value in values:
        result *= int(value)
    return result


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, type)


def _dtype_name(value: Any) -> str:
    return keras.backend.standardize_dtype(value.dtype)


def _spec_of(tensor: Any) -> TensorSpec:
    shape = tuple(int(dim) if dim is not None else None for dim in tensor.shape)
    if shape:
        shape = (None, *shape[1:])
    return TensorSpec(shape, _dtype_name(tensor))


def _encode_argument(value: Any) -> Any:
    if _is_tensor(value):
        return _spec_of(value)
    if isinstance(value, (list, tuple)) and value and all(_is_tensor(item) for item in value):
        return tuple(_spec_of(item) for item in value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return _UNSUPPORTED_ARGUMENT


_UNSUPPORTED_ARGUMENT = "<unsupported argument>"


def _flat_tensors(value: Any) -> list:
    if _is_tensor(value):
        return [value]
    if isinstance(value, Mapping):
        return [t for item in value.values() for t in _flat_tensors(item)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _flat_tensors(item)]
    return []


def _input_part(batch: Any) -> Any:
    """Returns the model-input part of a batch: `x` of `(x, y)` / `(x, y, w)`, else `batch`."""
    if hasattr(batch, "element_spec") or (
        hasattr(batch, "__iter__") and hasattr(batch, "__next__")
    ):
        batch = next(iter(batch))
    if isinstance(batch, tuple) and len(batch) in (2, 3):
        return batch[0]
    return batch


def _slice_batch(inputs: Any, count: int) -> Any:
    if _is_tensor(inputs):
        return inputs[:count]
    if isinstance(inputs, Mapping):
        return {key: _slice_batch(value, count) for key, value in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(_slice_batch(value, count) for value in inputs)
    return inputs


def _batch_size_of(inputs: Any) -> int:
    tensors = _flat_tensors(inputs)
    if not tensors:
        raise PlanError("the batch holds no arrays; pass `x` or `(x, y)` with NumPy/tensor arrays.")
    return int(tensors[0].shape[0])


def sample_inputs(model: keras.Model, batch_size: int = _CAPTURE_BATCH) -> Any:
    """Returns random inputs of `batch_size` samples matching a built model's inputs.

    Args:
        model: a Functional or Sequential model (subclassed models have no
            symbolic inputs; pass a sample batch to the functions that need one).
        batch_size: number of samples.

    Returns:
        A NumPy array, or a list of arrays for a multi-input model.

    Raises:
        PlanError: if the model has no known input shape.
    """
    try:
        symbolic = model.inputs
    except (AttributeError, ValueError):
        symbolic = None
    if not symbolic:
        raise PlanError(
            f"model {model.name!r} has no symbolic inputs (subclassed or unbuilt); "
            "pass a sample batch (`sample=x`)."
        )
    rng = np.random.default_rng(0)
    arrays = []
    for tensor in symbolic:
        dims = list(tensor.shape)
        if any(dim is None for dim in dims[1:]):
            raise PlanError(
                f"model input {tensor.name!r} has unknown dimensions {tuple(dims)}; "
                "pass a sample batch (`sample=x`)."
            )
        shape = (batch_size, *[int(dim) for dim in dims[1:]])
        dtype = _dtype_name(tensor)
        if "int" in dtype or dtype == "bool":
            arrays.append(np.zeros(shape, dtype=dtype))
        else:
            arrays.append(rng.standard_normal(shape).astype(dtype))
    return arrays[0] if len(arrays) == 1 else arrays


class _Recorder:
    """Temporary hooks on every layer's `call`, recording shapes and producer edges."""

    def __init__(self, paths: dict[str, keras.layers.Layer]):
        self.paths = paths
        self.calls: dict[str, list[LayerCall]] = {path: [] for path in paths}
        self.producer_of: dict[int, str] = {}
        self.raw_edges: list[tuple[int, str | None, str, int]] = []
        self.keep_alive: list[Any] = []
        self.installed: list[tuple[keras.layers.Layer, bool, Any]] = []

    def install(self) -> None:
        for path, layer in self.paths.items():
            had_own = "call" in vars(layer)
            previous = vars(layer).get("call")
            original = layer.call
            object.__setattr__(layer, "call", self._hook(path, layer, original))
            self.installed.append((layer, had_own, previous))

    def remove(self) -> None:
        for layer, had_own, previous in reversed(self.installed):
            if had_own:
                object.__setattr__(layer, "call", previous)
            else:
                object.__delattr__(layer, "call")
        self.installed.clear()
        self.keep_alive.clear()

    def _hook(self, path: str, layer: keras.layers.Layer, original):
        try:
            signature = inspect.signature(original)
        except (TypeError, ValueError):
            signature = None

        def hooked(*args, **kwargs):
            outputs = original(*args, **kwargs)
            self._record(path, layer, signature, args, kwargs, outputs)
            return outputs

        return hooked

    def _record(self, path, layer, signature, args, kwargs, outputs) -> None:
        arguments: list[tuple[str, Any]] = []
        if signature is not None:
            try:
                bound = signature.bind_partial(*args, **kwargs)
                named = list(bound.arguments.items())
            except TypeError:
                named = [(f"arg{index}", value) for index, value in enumerate(args)]
                named += list(kwargs.items())
        else:
            named = [(f"arg{index}", value) for index, value in enumerate(args)]
            named += list(kwargs.items())
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
        output_tensors = _flat_tensors(outputs)
        self.calls[path].append(
            LayerCall(
                path=path,
                class_name=type(layer).__name__,
                arguments=tuple(arguments),
                outputs=tuple(_spec_of(tensor) for tensor in output_tensors),
            )
        )
        for tensor in _flat_tensors((args, kwargs)):
            self.raw_edges.append(
                (
                    id(tensor),
                    self.producer_of.get(id(tensor)),
                    path,
                    _spec_of(tensor).elements_per_sample(),
                )
            )
        for tensor in output_tensors:
            self.producer_of.setdefault(id(tensor), path)
            self.keep_alive.append(tensor)
        self.keep_alive.extend(_flat_tensors((args, kwargs)))


def _prune_edges(
    raw_edges: list[tuple[int, str | None, str, int]], input_ids: set[int]
) -> tuple[Edge, ...]:
    """Drops edges into containers whose descendants consume the same tensor, and self-loops."""
    consumers_of: dict[int, set[str]] = {}
    for tensor_id, _, consumer, _ in raw_edges:
        consumers_of.setdefault(tensor_id, set()).add(consumer)
    edges: list[Edge] = []
    seen: set[tuple[str | None, str, int]] = set()
    for tensor_id, producer, consumer, elements in raw_edges:
        if producer is None and tensor_id not in input_ids:
            continue
        if producer is not None and (producer == consumer or producer.startswith(consumer + "/")):
            continue
        if any(other.startswith(consumer + "/") for other in consumers_of[tensor_id]):
            continue
        key = (producer, consumer, tensor_id)
        if key in seen:
            continue
        seen.add(key)
        edges.append(Edge(producer, consumer, elements))
    return tuple(edges)


def trace_model(model: keras.Model, sample: Any = None) -> ModelTrace:
    """Runs one inference forward pass with temporary hooks and records every layer's shapes.

    Args:
        model: a built Keras model.
        sample: model inputs (a few samples suffice); by default random inputs
            built from the model's symbolic inputs.

    Returns:
        A `ModelTrace`. The model is left exactly as it was (hooks removed,
        inference mode: no statistic updates).

    Example:

    ```python
    trace = autoprec.cost.trace_model(model)
    trace.calls["dense"][0].outputs[0].shape  # (None, 16)
    ```
    """
    inputs = sample_inputs(model) if sample is None else _slice_batch(sample, _CAPTURE_BATCH)
    inputs = keras.tree.map_structure(
        lambda value: (
            keras.ops.convert_to_tensor(value) if isinstance(value, np.ndarray) else value
        ),
        inputs,
    )
    paths = layer_paths(model)
    recorder = _Recorder(paths)
    recorder.install()
    try:
        model(inputs, training=False)
        input_ids = {id(tensor) for tensor in _flat_tensors(inputs)}
        edges = _prune_edges(recorder.raw_edges, input_ids)
    finally:
        recorder.remove()
    return ModelTrace(
        calls={path: tuple(calls) for path, calls in recorder.calls.items()}, edges=edges
    )


# =========================================================================== counting


@dataclasses.dataclass(frozen=True)
class LayerCost:
    """Per-sample arithmetic and memory traffic of one layer, independent of dtype.

    Attributes:
        path: stable path.
        class_name: layer class.
        matmul_flops: forward FLOPs in matmuls/convolutions (tensor-core eligible), per sample.
        vector_flops: forward elementwise/reduction FLOPs, per sample.
        backward_matmul_flops: backward matmul FLOPs (input and weight gradients), per sample.
        backward_vector_flops: backward elementwise FLOPs, per sample.
        activation_elements: elements read and written in the forward pass, per sample.
        saved_elements: elements kept for the backward pass, per sample.
        weight_elements: weight elements the layer reads (not per sample).
        matmul_dims: matmul/conv dimensions that 16-bit tensor cores want aligned.
        kernels: approximate number of kernels launched forward+backward.
        note: how the count was made when not from an exact formula.
    """

    path: str
    class_name: str
    matmul_flops: float = 0.0
    vector_flops: float = 0.0
    backward_matmul_flops: float = 0.0
    backward_vector_flops: float = 0.0
    activation_elements: float = 0.0
    saved_elements: float = 0.0
    weight_elements: int = 0
    matmul_dims: tuple[int, ...] = ()
    kernels: int = 0
    note: str = ""

    @property
    def forward_flops(self) -> float:
        """Forward FLOPs per sample."""
        return self.matmul_flops + self.vector_flops

    @property
    def backward_flops(self) -> float:
        """Backward FLOPs per sample."""
        return self.backward_matmul_flops + self.backward_vector_flops

    @property
    def is_free(self) -> bool:
        """Whether the layer does no work of its own (views, containers)."""
        return self.forward_flops == 0 and self.activation_elements == 0

    def bytes_moved(self, dtype: str, batch_size: int) -> float:
        """Returns bytes read and written forward+backward for a batch in `dtype`.

        Activations move in the compute dtype (backward ~2x forward traffic);
        float32 master weights are read, cast to 16-bit and read again.
        """
        itemsize = _ITEMSIZE[dtype]
        activation_bytes = 3 * self.activation_elements * batch_size * itemsize
        weight_cast = 0 if dtype == FLOAT32 else 2 * itemsize
        weight_bytes = self.weight_elements * (4 + itemsize + weight_cast + 4)
        return activation_bytes + weight_bytes

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["matmul_dims"] = list(self.matmul_dims)
        return data


def _activation_flops(activation: Any) -> int:
    name = getattr(activation, "__name__", None) or str(activation)
    return ACTIVATION_FLOPS.get(name, _DEFAULT_ACTIVATION_FLOPS)


def _bias_and_activation(layer, output_elements: float) -> float:
    flops = 0.0
    if getattr(layer, "use_bias", False) or getattr(layer, "bias", None) is not None:
        flops += output_elements
    activation = getattr(layer, "activation", None)
    if activation is not None:
        flops += _activation_flops(activation) * output_elements
    return flops


def _elements(specs: Sequence[TensorSpec]) -> float:
    return float(sum(spec.elements_per_sample() for spec in specs))


def _io_elements(call: LayerCall) -> float:
    float_inputs = [spec for spec in call.inputs if "float" in spec.dtype]
    return _elements(float_inputs) + _elements(call.outputs)


def _channel_axis(layer) -> int:
    return 1 if getattr(layer, "data_format", "channels_last") == "channels_first" else -1


def _matmul_layer(
    call: LayerCall, layer, matmul: float, dims: Sequence[int], weights: int, output: float
) -> dict[str, Any]:
    vector = _bias_and_activation(layer, output)
    return {
        "matmul_flops": matmul,
        "vector_flops": vector,
        "backward_matmul_flops": 2 * matmul,
        "backward_vector_flops": vector,
        "activation_elements": _io_elements(call),
        "saved_elements": output + _elements(call.inputs),
        "weight_elements": weights,
        "matmul_dims": tuple(int(dim) for dim in dims),
        "kernels": 3 + (1 if vector else 0) * 2,
    }


def _weights(layer) -> int:
    return int(sum(_product(weight.shape) for weight in layer.trainable_weights)) if layer else 0


def _count_dense(call: LayerCall, layer) -> dict[str, Any]:
    inputs = call.inputs[0]
    rows = inputs.elements_per_sample() // int(inputs.shape[-1])
    features_in = int(inputs.shape[-1])
    units = int(layer.units)
    output = rows * units
    return _matmul_layer(
        call, layer, 2.0 * rows * features_in * units, (features_in, units), _weights(layer), output
    )


def _einsum_flops(equation: str, shape_a: Sequence[int], shape_b: Sequence[int]) -> float:
    """Returns 2 x the product of every index size of a two-operand einsum."""
    operands, _, _ = equation.replace(" ", "").partition("->")
    terms = operands.split(",")
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, (shape_a, shape_b)):
        if "..." in term:
            head, _, tail = term.partition("...")
            ellipsis_rank = len(shape) - len(head) - len(tail)
            sizes["..."] = max(
                sizes.get("...", 1), _product(shape[len(head) : len(head) + ellipsis_rank])
            )
            letters = list(head) + list(tail)
            dims = list(shape[: len(head)]) + list(shape[len(shape) - len(tail) :])
        else:
            letters, dims = list(term), list(shape)
        for letter, dim in zip(letters, dims):
            sizes[letter] = int(dim)
    return 2.0 * _product(sizes.values())


def _count_einsum_dense(call: LayerCall, layer) -> dict[str, Any]:
    inputs = call.inputs[0].concrete_shape(1)
    kernel_shape = tuple(int(dim) for dim in layer.kernel.shape)
    matmul = _einsum_flops(layer.equation, inputs, kernel_shape)
    output = _elements(call.outputs)
    return _matmul_layer(call, layer, matmul, kernel_shape, _weights(layer), output)


def _conv_kind(class_name: str) -> str:
    if class_name.startswith("DepthwiseConv"):
        return "depthwise"
    if class_name.startswith("SeparableConv"):
        return "separable"
    if "Transpose" in class_name:
        return "transpose"
    return "conv"


def _count_conv(call: LayerCall, layer) -> dict[str, Any]:
    kind = _conv_kind(type(layer).__name__)
    axis = _channel_axis(layer)
    inputs = call.inputs[0]
    output = _elements(call.outputs)
    in_channels = int(inputs.shape[axis])
    window = _product(layer.kernel_size)
    groups = int(getattr(layer, "groups", 1) or 1)
    weights = _weights(layer)
    if kind == "conv":
        filters = int(layer.filters)
        positions = output / filters
        matmul = 2.0 * positions * filters * window * in_channels / groups
        return _matmul_layer(call, layer, matmul, (in_channels // groups, filters), weights, output)
    if kind == "transpose":
        filters = int(layer.filters)
        input_positions = inputs.elements_per_sample() / in_channels
        matmul = 2.0 * input_positions * in_channels * window * filters
        return _matmul_layer(call, layer, matmul, (in_channels, filters), weights, output)
    multiplier = int(getattr(layer, "depth_multiplier", 1) or 1)
    if kind == "depthwise":
        depthwise = 2.0 * output * window
        counts = _matmul_layer(call, layer, 0.0, (), weights, output)
        counts["vector_flops"] += depthwise
        counts["backward_vector_flops"] += 2 * depthwise
        return counts
    filters = int(layer.filters)
    positions = output / filters
    depthwise = 2.0 * positions * in_channels * multiplier * window
    pointwise = 2.0 * positions * in_channels * multiplier * filters
    counts = _matmul_layer(
        call, layer, pointwise, (in_channels * multiplier, filters), weights, output
    )
    counts["vector_flops"] += depthwise
    counts["backward_vector_flops"] += 2 * depthwise
    counts["activation_elements"] += 2 * positions * in_channels * multiplier
    return counts


def _count_attention(call: LayerCall, layer) -> dict[str, Any]:
    """Counts the q.k and softmax.v einsums of MultiHeadAttention (projections are children)."""
    query = call.argument("query") or call.inputs[0]
    value = call.argument("value") or (call.inputs[1] if len(call.inputs) > 1 else query)
    heads = int(layer.num_heads)
    key_dim = int(layer.key_dim)
    value_dim = int(layer.value_dim or layer.key_dim)
    target = query.elements_per_sample() // int(query.shape[-1])
    source = value.elements_per_sample() // int(value.shape[-1])
    scores = heads * target * source
    matmul = 2.0 * scores * key_dim + 2.0 * scores * value_dim
    vector = 5.0 * scores + heads * target * key_dim
    return {
        "matmul_flops": matmul,
        "vector_flops": vector,
        "backward_matmul_flops": 2 * matmul,
        "backward_vector_flops": 2 * vector,
        "activation_elements": 3.0 * scores + 2.0 * heads * (target + source) * key_dim,
        "saved_elements": 2.0 * scores,
        "weight_elements": 0,
        "matmul_dims": (key_dim, value_dim),
        "kernels": 10,
    }


def _count_rnn(call: LayerCall, layer) -> dict[str, Any]:
    class_name = type(layer).__name__
    sequences = call.inputs[0]
    steps = int(sequences.shape[1]) if len(sequences.shape) > 2 else 1
    features = sequences.elements_per_sample() // max(steps, 1)
    units = int(layer.units)
    gates = _RNN_GATES.get(class_name, 1)
    matmul = 2.0 * steps * (features + units) * gates * units
    vector = float(steps * units * _RNN_VECTOR_FLOPS_PER_UNIT.get(class_name, 4))
    return {
        "matmul_flops": matmul,
        "vector_flops": vector,
        "backward_matmul_flops": 2 * matmul,
        "backward_vector_flops": 2 * vector,
        "activation_elements": _io_elements(call) + steps * gates * units,
        "saved_elements": float(steps * (gates + 2) * units),
        "weight_elements": _weights(layer),
        "matmul_dims": (features, units),
        "kernels": 6 * steps,
    }


def _count_embedding(call: LayerCall, layer) -> dict[str, Any]:
    output = _elements(call.outputs)
    return {
        "backward_vector_flops": output,
        "activation_elements": output + _elements(call.inputs),
        "saved_elements": 0.0,
        "weight_elements": 0,
        "kernels": 3,
    }


def _count_normalisation(call: LayerCall, layer) -> dict[str, Any]:
    elements = _elements(call.outputs)
    return {
        "vector_flops": 8.0 * elements,
        "backward_vector_flops": 16.0 * elements,
        "activation_elements": _io_elements(call),
        "saved_elements": elements,
        "weight_elements": _weights(layer),
        "kernels": 6,
    }


def _count_pooling(call: LayerCall, layer) -> dict[str, Any]:
    class_name = type(layer).__name__
    output = _elements(call.outputs)
    if class_name.startswith("Global"):
        flops = _elements(call.inputs)
    else:
        flops = output * _product(getattr(layer, "pool_size", (1,)))
    return {
        "vector_flops": flops,
        "backward_vector_flops": flops,
        "activation_elements": _io_elements(call),
        "saved_elements": output if "Max" in class_name else 0.0,
        "kernels": 2,
    }


def _count_elementwise(call: LayerCall, flops_per_element: float, note: str = "") -> dict:
    output = _elements(call.outputs)
    return {
        "vector_flops": flops_per_element * output,
        "backward_vector_flops": flops_per_element * output,
        "activation_elements": _io_elements(call),
        "saved_elements": output,
        "kernels": 2,
        "note": note,
    }


def _count_activation_layer(call: LayerCall, layer) -> dict[str, Any]:
    class_name = type(layer).__name__
    if class_name == "Activation":
        per_element = _activation_flops(layer.activation)
    else:
        per_element = ACTIVATION_FLOPS.get(
            re.sub(r"(?<!^)(?=[A-Z])", "_", class_name).lower(), _DEFAULT_ACTIVATION_FLOPS
        )
    return _count_elementwise(call, per_element)


def _count_call(call: LayerCall, layer, info: LayerInfo | None, parent_class: str) -> dict:
    """Returns the cost fields of one call of `layer` (empty for free layers)."""
    class_name = type(layer).__name__
    if class_name == "MultiHeadAttention":
        return _count_attention(call, layer)
    if class_name in _RNN_GATES:
        return _count_rnn(call, layer)
    if class_name.endswith("Cell") or parent_class in _RNN_GATES:
        return {"note": "counted in its recurrent layer"}
    if info is not None and info.is_container:
        return {}
    if class_name in _VIEW_CLASSES:
        return {}
    if class_name in ("Dense",):
        return _count_dense(call, layer)
    if class_name == "EinsumDense":
        return _count_einsum_dense(call, layer)
    if re.match(r"^(Conv|DepthwiseConv|SeparableConv)\d?D(Transpose)?$", class_name) or (
        class_name in ("Convolution2D", "Conv2DTranspose")
    ):
        return _count_conv(call, layer)
    if class_name == "Embedding":
        return _count_embedding(call, layer)
    if class_name in _NORMALISATION_CLASSES:
        return _count_normalisation(call, layer)
    if "Pooling" in class_name:
        return _count_pooling(call, layer)
    if class_name in _MERGE_CLASSES:
        return _count_elementwise(call, max(len(call.inputs) - 1, 1))
    if class_name in _DROPOUT_CLASSES:
        return _count_elementwise(call, 2)
    if class_name in _COPY_CLASSES:
        return {"activation_elements": _io_elements(call), "kernels": 2}
    if class_name in ("Activation", "ReLU", "Softmax", "LeakyReLU", "PReLU", "ELU"):
        return _count_activation_layer(call, layer)
    if class_name in ("Rescaling", "Normalization"):
        return _count_elementwise(call, 2)
    return _count_elementwise(call, 1, note=f"estimated: no formula for {class_name}")


def _merge_counts(path: str, class_name: str, counts: list[dict]) -> LayerCost:
    totals: dict[str, Any] = {}
    notes = []
    for fields in counts:
        for key, value in fields.items():
            if key == "note":
                if value:
                    notes.append(value)
            elif key == "matmul_dims":
                totals[key] = tuple(totals.get(key, ())) + tuple(value)
            elif key == "weight_elements":
                totals[key] = max(totals.get(key, 0), int(value))
            else:
                totals[key] = totals.get(key, 0) + value
    return LayerCost(path=path, class_name=class_name, note="; ".join(sorted(set(notes))), **totals)


def count_costs(model: keras.Model, trace: ModelTrace | None = None) -> dict[str, LayerCost]:
    """Returns the per-sample FLOPs and memory traffic of every layer of `model`.

    Layers are counted from the shapes they saw (`trace_model`); a layer called
    several times (shared) counts every call. Containers count nothing themselves
    except `MultiHeadAttention` (its q.k and softmax.v einsums; the projections are
    its inner `EinsumDense` layers) and recurrent layers (the whole recurrence; their
    cells count nothing).

    Args:
        model: a built Keras model.
        trace: a `ModelTrace` of the model; traced with random inputs when omitted.

    Returns:
        `{stable_path: LayerCost}` for every layer, in traversal order.

    Example:

    ```python
    costs = autoprec.cost.count_costs(model)
    costs["dense"].matmul_flops  # 2 * 8 * 16 per sample for Dense(16) on 8 features
    ```
    """
    trace = trace or trace_model(model)
    paths = layer_paths(model)
    infos = describe_model(model)
    result: dict[str, LayerCost] = {}
    for path, layer in paths.items():
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        parent_class = type(paths[parent]).__name__ if parent in paths else ""
        counts = [
            _count_call(call, layer, infos.get(path), parent_class)
            for call in trace.calls.get(path, ())
        ]
        result[path] = _merge_counts(path, type(layer).__name__, counts)
    return result


# =========================================================================== cost table


@dataclasses.dataclass
class LayerCostRecord:
    """Cost of one layer in each dtype for one batch (a row of a `CostTable`).

    Attributes:
        path: stable path.
        class_name: layer class.
        seconds: forward+backward seconds per dtype for the table's batch size
            (`None`: infeasible on the device).
        forward_flops: forward FLOPs for the batch.
        backward_flops: backward FLOPs for the batch.
        bytes_moved: bytes moved forward+backward per dtype for the batch.
        saved_elements_per_sample: activation elements kept for backward, per sample.
        weight_elements: weight elements of the layer.
        source: `"measured"`, `"predicted"`, `"cached"` or `"predicted (fallback: ...)"`.
        note: how the FLOPs were counted when not by an exact formula.
    """

    path: str
    class_name: str
    seconds: dict[str, float | None]
    forward_flops: float
    backward_flops: float
    bytes_moved: dict[str, float]
    saved_elements_per_sample: float
    weight_elements: int
    source: str
    note: str = ""


@dataclasses.dataclass
class CostTable:
    """Per-layer, per-dtype forward+backward costs of one model on one device.

    Attributes:
        device: device name (`HardwareProfile.display_name`).
        source: `"measured"` (by `calibrate`) or `"predicted"` (by `predict_costs`).
        batch_size: the batch size the seconds are for.
        layers: `{path: LayerCostRecord}`.
        edges: `(producer path or None for a model input, consumer path,
            elements per sample)` for the tensors passed between layers.
        cast_seconds: per 16-bit dtype, `{"fixed": s, "per_element": s}` for one
            cast to/from float32.
        step_overhead_seconds: fixed per-step time outside the layers (optimizer,
            loss, framework), the same for every dtype; 0 unless a whole step was
            measured.
        layer_time_scale: factor applied to float32 layer times, and to the layer
            times of any dtype without its own entry in `layer_time_scale_by_dtype`
            (1 unless a measured whole step disagreed with the summed layers).
        layer_fixed_seconds: per-layer time that does not scale with batch size.
        measured_step_seconds: the whole float32 step measured by `calibrate`, if any.
        measured_step_seconds_by_dtype: `{dtype: seconds}` of the whole steps
            `calibrate` measured under each uniform policy (float32 included).
        layer_time_scale_by_dtype: `{dtype: factor}` applied to that dtype's layer
            times; set for each dtype in `measured_step_seconds_by_dtype`, so that
            `estimate` of a uniform plan in that dtype equals its measured step.
        memory_bytes: memory of the device.
        model_fingerprint: `autoprec.layers.model_fingerprint` of the model.
        versions: framework versions the figures were taken with.
        stats: counts of measured, cached and fallback entries.

    Example:

    ```python
    table = autoprec.cost.predict_costs(model, autoprec.hardware.get("rtx4090"), 64)
    table.save("/tmp/costs.json"); autoprec.cost.CostTable.load("/tmp/costs.json")
    ```
    """

    device: str
    source: str
    batch_size: int
    layers: dict[str, LayerCostRecord]
    edges: list[tuple[str | None, str, int]]
    cast_seconds: dict[str, dict[str, float]]
    step_overhead_seconds: float = 0.0
    layer_time_scale: float = 1.0
    layer_fixed_seconds: float = 0.0
    measured_step_seconds: float | None = None
    memory_bytes: int | None = None
    model_fingerprint: str = ""
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    stats: dict[str, int] = dataclasses.field(default_factory=dict)
    measured_step_seconds_by_dtype: dict[str, float] = dataclasses.field(default_factory=dict)
    layer_time_scale_by_dtype: dict[str, float] = dataclasses.field(default_factory=dict)

    def time_scale(self, dtype: str) -> float:
        """Returns the factor applied to every layer time of `dtype`.

        Args:
            dtype: compute dtype.

        Returns:
            `layer_time_scale_by_dtype[dtype]` when a whole step in `dtype` was
            measured, else `layer_time_scale`.
        """
        return float(self.layer_time_scale_by_dtype.get(dtype, self.layer_time_scale))

    def seconds(self, path: str, dtype: str, batch_size: int | None = None) -> float:
        """Returns a layer's forward+backward seconds in `dtype` (`inf`: infeasible).

        Args:
            path: stable layer path.
            dtype: compute dtype.
            batch_size: batch to scale to (linear above `layer_fixed_seconds`).

        Returns:
            Seconds, scaled by `time_scale(dtype)`.
        """
        record = self.layers[path]
        value = record.seconds.get(dtype)
        if value is None:
            return math.inf
        return self.time_scale(dtype) * self._scale(value, batch_size)

    def _scale(self, seconds: float, batch_size: int | None) -> float:
        if batch_size is None or batch_size == self.batch_size or seconds == 0:
            return seconds
        fixed = min(self.layer_fixed_seconds, seconds)
        return fixed + (seconds - fixed) * batch_size / self.batch_size

    def cast_cost(self, elements: float, dtype: str) -> float:
        """Returns seconds to cast `elements` to `dtype` and the gradient back (fwd+bwd)."""
        figures = self.cast_seconds.get(dtype) or self.cast_seconds.get("bfloat16") or {}
        one_way = figures.get("fixed", 0.0) + figures.get("per_element", 0.0) * elements
        return 2.0 * one_way

    def to_dict(self) -> dict[str, Any]:
        """Returns the table as a JSON-serialisable dict."""
        return {
            "format": _TABLE_FORMAT,
            "device": self.device,
            "source": self.source,
            "batch_size": self.batch_size,
            "step_overhead_seconds": self.step_overhead_seconds,
            "layer_time_scale": self.layer_time_scale,
            "layer_fixed_seconds": self.layer_fixed_seconds,
            "measured_step_seconds": self.measured_step_seconds,
            "memory_bytes": self.memory_bytes,
            "model_fingerprint": self.model_fingerprint,
            "versions": dict(self.versions),
            "stats": dict(self.stats),
            "measured_step_seconds_by_dtype": dict(self.measured_step_seconds_by_dtype),
            "layer_time_scale_by_dtype": dict(self.layer_time_scale_by_dtype),
            "cast_seconds": {key: dict(value) for key, value in self.cast_seconds.items()},
            "edges": [list(edge) for edge in self.edges],
            "layers": {path: dataclasses.asdict(record) for path, record in self.layers.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "cost table") -> CostTable:
        """Builds a table from `to_dict` output.

        Tables written before per-dtype whole steps existed (scalar
        `step_overhead_seconds`, `layer_time_scale` and `measured_step_seconds`
        only) read as tables whose corrections apply to every dtype alike.

        Raises:
            PlanError: naming `source` when a field is missing or malformed.
        """
        try:
            layers = {
                path: LayerCostRecord(**record) for path, record in dict(data["layers"]).items()
            }
            return cls(
                device=str(data["device"]),
                source=str(data["source"]),
                batch_size=int(data["batch_size"]),
                layers=layers,
                edges=[(edge[0], edge[1], int(edge[2])) for edge in data["edges"]],
                cast_seconds={key: dict(value) for key, value in data["cast_seconds"].items()},
                step_overhead_seconds=float(data.get("step_overhead_seconds", 0.0)),
                layer_time_scale=float(data.get("layer_time_scale", 1.0)),
                layer_fixed_seconds=float(data.get("layer_fixed_seconds", 0.0)),
                measured_step_seconds=data.get("measured_step_seconds"),
                memory_bytes=data.get("memory_bytes"),
                model_fingerprint=str(data.get("model_fingerprint", "")),
                versions=dict(data.get("versions", {})),
                stats=dict(data.get("stats", {})),
                measured_step_seconds_by_dtype=_float_mapping(
                    data.get("measured_step_seconds_by_dtype")
                ),
                layer_time_scale_by_dtype=_float_mapping(data.get("layer_time_scale_by_dtype")),
            )
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise PlanError(f"{source}: malformed cost table ({error!r}).") from None

    def save(self, path: str | os.PathLike) -> Path:
        """Writes the table to a JSON file atomically."""
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> CostTable:
        """Reads a table written by `save`."""
        return cls.from_dict(read_json_file(path, PlanError, "cost table"), source=str(path))

    def summary(self, limit: int = 40) -> str:
        """Returns a table of the most expensive layers' milliseconds per dtype."""
        dtypes = [
            dtype
            for dtype in COMPUTE_DTYPES
            if any(dtype in record.seconds for record in self.layers.values())
        ]
        rows = sorted(
            (record for record in self.layers.values() if any(record.seconds.values())),
            key=lambda record: -(record.seconds.get(FLOAT32) or 0.0),
        )[:limit]
        width = max([len(record.path) for record in rows] + [5])
        header = f"{'layer':<{width}}  " + "  ".join(f"{dtype:>9}" for dtype in dtypes)
        lines = [f"{self.source} costs on {self.device}, batch {self.batch_size} (ms)", header]
        for record in rows:
            cells = []
            for dtype in dtypes:
                value = record.seconds.get(dtype)
                cells.append(f"{'-' if value is None else f'{value * 1e3:.3f}':>9}")
            lines.append(f"{record.path:<{width}}  " + "  ".join(cells))
        lines.append(f"step overhead {self.step_overhead_seconds * 1e3:.2f} ms")
        for dtype, measured in self.measured_step_seconds_by_dtype.items():
            lines.append(
                f"whole {dtype} step measured {measured * 1e3:.2f} ms; "
                f"{dtype} layer times x {self.time_scale(dtype):.3f}"
            )
        return "\n".join(lines)


def _float_mapping(value: Any) -> dict[str, float]:
    """Returns `{str: float}` from a decoded JSON object (`{}` for a missing field)."""
    if value is None:
        return {}
    return {str(key): float(item) for key, item in dict(value).items()}


# =========================================================================== prediction


def predicted_layer_seconds(
    cost: LayerCost, hardware: hardware_module.HardwareProfile, dtype: str, batch_size: int
) -> float | None:
    """Returns roofline forward+backward seconds of one layer in `dtype` (`None`: infeasible).

    `max(compute time, memory time) + kernels x op overhead`, where matmul FLOPs
    run at the dtype's peak (float32 peak when 16-bit dimensions are not
    multiples of `hardware.alignment`), vector FLOPs at the float32 vector rate,
    and a dtype without native kernels is multiplied by `hardware.slow_penalty`.

    Args:
        cost: the layer's `LayerCost`.
        hardware: the device profile.
        dtype: compute dtype.
        batch_size: samples per step.

    Returns:
        Seconds, or `None` where the device cannot run `dtype`.
    """
    support = hardware.support(dtype)
    if support == hardware_module.UNSUPPORTED:
        return None
    if cost.is_free:
        return 0.0
    aligned = all(dim % max(hardware.alignment, 1) == 0 for dim in cost.matmul_dims)
    matmul_rate = hardware.peak_flops(dtype if aligned else FLOAT32) * MATMUL_EFFICIENCY
    vector_rate = hardware.float32_flops * VECTOR_EFFICIENCY
    matmul_flops = (cost.matmul_flops + cost.backward_matmul_flops) * batch_size
    vector_flops = (cost.vector_flops + cost.backward_vector_flops) * batch_size
    compute_seconds = matmul_flops / matmul_rate + vector_flops / vector_rate
    memory_seconds = cost.bytes_moved(dtype, batch_size) / hardware.memory_bandwidth
    work_seconds = max(compute_seconds, memory_seconds)
    if support == hardware_module.SLOW:
        work_seconds *= hardware.slow_penalty
    return work_seconds + max(cost.kernels, 1) * hardware.op_overhead_seconds


def _predicted_cast_seconds(hardware: hardware_module.HardwareProfile) -> dict[str, dict]:
    return {
        dtype: {
            "fixed": hardware.op_overhead_seconds,
            "per_element": (4 + _ITEMSIZE[dtype]) / hardware.memory_bandwidth,
        }
        for dtype in COMPUTE_DTYPES
        if dtype != FLOAT32
    }


def _versions() -> dict[str, str]:
    versions = {"keras": keras.__version__, "backend": keras.backend.backend()}
    if keras.backend.backend() in MEASURING_BACKENDS:
        versions.update(_timing_backend("autoprec.cost").versions())
    return versions


def _record(
    cost: LayerCost,
    seconds: dict[str, float | None],
    batch_size: int,
    dtypes: Sequence[str],
    source: str,
) -> LayerCostRecord:
    return LayerCostRecord(
        path=cost.path,
        class_name=cost.class_name,
        seconds=seconds,
        forward_flops=cost.forward_flops * batch_size,
        backward_flops=cost.backward_flops * batch_size,
        bytes_moved={dtype: cost.bytes_moved(dtype, batch_size) for dtype in dtypes},
        saved_elements_per_sample=cost.saved_elements,
        weight_elements=cost.weight_elements,
        source=source,
        note=cost.note,
    )


def _resolve_hardware(hardware: Any) -> hardware_module.HardwareProfile:
    if hardware is None:
        return hardware_module.detect()
    if isinstance(hardware, hardware_module.HardwareProfile):
        return hardware
    if isinstance(hardware, str):
        return hardware_module.get(hardware)
    raise HardwareError(
        f"expected a HardwareProfile, a profile name or 'local', got {type(hardware).__name__}."
    )


def predict_costs(
    model: keras.Model,
    hardware: hardware_module.HardwareProfile | str | None = None,
    batch_size: int = 32,
    sample: Any = None,
    dtypes: Sequence[str] = COMPUTE_DTYPES,
) -> CostTable:
    """Predicts every layer's forward+backward seconds per dtype with a roofline model.

    Args:
        model: a built Keras model.
        hardware: a `HardwareProfile`, a profile name (`"rtx4090"`) or `None`/`"local"`
            for this device.
        batch_size: samples per training step.
        sample: model inputs for shape tracing (needed for subclassed models).
        dtypes: dtypes to predict.

    Returns:
        A `CostTable` with `source="predicted"`.

    Example:

    ```python
    table = autoprec.cost.predict_costs(model, "rtx2080ti", batch_size=64)
    table.seconds("dense", "bfloat16")  # slower than float16: no bf16 tensor cores
    ```
    """
    profile = _resolve_hardware(hardware)
    trace = trace_model(model, sample)
    counts = count_costs(model, trace)
    dtypes = [canonical_dtype(dtype) for dtype in dtypes]
    layers = {
        path: _record(
            cost,
            {dtype: predicted_layer_seconds(cost, profile, dtype, batch_size) for dtype in dtypes},
            batch_size,
            dtypes,
            "predicted",
        )
        for path, cost in counts.items()
    }
    return CostTable(
        device=profile.display_name,
        source="predicted",
        batch_size=int(batch_size),
        layers=layers,
        edges=[(edge.producer, edge.consumer, edge.elements_per_sample) for edge in trace.edges],
        cast_seconds=_predicted_cast_seconds(profile),
        layer_fixed_seconds=profile.op_overhead_seconds,
        memory_bytes=profile.memory_bytes,
        model_fingerprint=model_fingerprint(model),
        versions=_versions(),
        stats={"predicted": len(layers)},
    )


# =========================================================================== measurement


def default_cache_dir() -> Path:
    """Returns the cost cache folder: `$AUTOPREC_CACHE_DIR` or `~/.cache/autoprec`."""
    configured = os.environ.get("AUTOPREC_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autoprec"


class _Cache:
    """One small JSON file per measurement under `<dir>/costs/<device>/`, written atomically."""

    def __init__(self, directory: Path | None, device: str, versions: Mapping[str, str]):
        self.directory = None
        if directory is not None:
            slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "device"
            self.directory = Path(directory) / "costs" / slug
        self.device = device
        self.versions = dict(versions)

    def key(self, payload: Any) -> str:
        text = json.dumps(
            {"format": _CACHE_FORMAT, "device": self.device, "versions": self.versions, **payload},
            sort_keys=True,
            default=repr,
        )
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]

    def get(self, key: str) -> float | None:
        if self.directory is None:
            return None
        file_path = self.directory / f"{key}.json"
        try:
            data = json.loads(file_path.read_text(encoding="utf-8"))
            return float(data["seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, seconds: float, description: str) -> None:
        if self.directory is None:
            return
        try:
            atomic_write_json(
                self.directory / f"{key}.json", {"seconds": seconds, "what": description}
            )
        except OSError:
            pass


def _layer_signature(layer: keras.layers.Layer, call: LayerCall, batch_size: int) -> dict:
    try:
        config = dict(layer.get_config())
    except Exception:
        config = {"unserialisable": type(layer).__qualname__}
    for field in ("name", "dtype", "trainable"):
        config.pop(field, None)
    return {
        "class": f"{type(layer).__module__}.{type(layer).__qualname__}",
        "config": config,
        "arguments": call.signature(),
        "batch_size": batch_size,
    }


#: Keras backends `calibrate` and `measure_train_steps` can time on.
MEASURING_BACKENDS = ("tensorflow", "jax")


def _timing_backend(what: str):
    """Returns the active backend's timing module (see `autoprec._backends.timing_backend`)."""
    from ._backends import timing_backend

    return timing_backend(what, MEASURING_BACKENDS)


def _make_tensor(spec: TensorSpec, batch_size: int, dtype: str, rng: np.random.Generator):
    """Returns a backend tensor of `spec`'s shape at `batch_size`: random floats in `dtype`."""
    shape = spec.concrete_shape(batch_size)
    if spec.dtype == "bool":
        return keras.ops.ones(shape, dtype="bool")
    if "float" not in spec.dtype:
        return keras.ops.zeros(shape, dtype=spec.dtype)
    return _timing_backend("calibrate()").random_tensor(shape, dtype, rng)


def _rebuild_layer(layer: keras.layers.Layer, dtype: str) -> keras.layers.Layer:
    config = layer.get_config()
    config["dtype"] = POLICY_FOR_DTYPE[dtype]
    config.pop("name", None)
    return layer.__class__.from_config(config)


def _call_arguments(call: LayerCall, batch_size: int, dtype: str, rng) -> tuple[list, dict]:
    args: list = []
    kwargs: dict = {}
    for index, (name, value) in enumerate(call.arguments):
        if value == _UNSUPPORTED_ARGUMENT:
            raise BackendError(f"argument {name!r} of {call.path} cannot be rebuilt")
        if isinstance(value, TensorSpec):
            built: Any = _make_tensor(value, batch_size, dtype, rng)
        elif isinstance(value, tuple):
            built = [_make_tensor(item, batch_size, dtype, rng) for item in value]
        else:
            built = value
        if index == 0:
            args.append(built)
        elif value is not None:
            kwargs[name] = built
    return args, kwargs


def _time_function(function, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        function()
    first_start = time.perf_counter()
    function()
    first = time.perf_counter() - first_start
    if first > 0.5:
        repeats = min(repeats, 2)
    samples = [first]
    for _ in range(max(repeats - 1, 0)):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return float(statistics.median(samples))


def _time_layer(
    layer: keras.layers.Layer,
    call: LayerCall,
    dtype: str,
    batch_size: int,
    repeats: int,
    jit_compile: bool,
) -> float:
    """Times a standalone copy of `layer` forward+backward in `dtype` on random inputs."""
    timing = _timing_backend("calibrate()")
    rng = np.random.default_rng(0)
    clone = _rebuild_layer(layer, dtype)
    compute = keras.backend.standardize_dtype(clone.compute_dtype)
    args, kwargs = _call_arguments(call, batch_size, compute, rng)
    if "training" in inspect.signature(clone.call).parameters:
        kwargs["training"] = True
    return _time_function(timing.layer_step(clone, args, kwargs, jit_compile), repeats)


def _time_empty_function(repeats: int) -> float:
    """Times a compiled function doing one trivial op: the per-call dispatch overhead."""
    timing = _timing_backend("calibrate()")
    return _time_function(timing.empty_step(), max(repeats, 9))


def _time_cast(dtype: str, elements: int, repeats: int) -> float:
    """Times one cast of `elements` values between float32 and `dtype` (half a round trip)."""
    timing = _timing_backend("calibrate()")
    return _time_function(timing.cast_step(dtype, elements), repeats) / 2.0


def _measure_casts(
    dtypes: Sequence[str], cache: _Cache, repeats: int, dispatch_seconds: float
) -> dict[str, dict[str, float]]:
    """Fits `fixed + per_element x n` for one cast between float32 and each 16-bit dtype."""
    small, large = 1024, 1 << 21
    result = {}
    for dtype in dtypes:
        if dtype == FLOAT32:
            continue
        timings = []
        for elements in (small, large):
            key = cache.key({"cast": dtype, "elements": elements})
            seconds = cache.get(key)
            if seconds is None:
                seconds = _time_cast(dtype, elements, repeats)
                cache.put(key, seconds, f"cast float32<->{dtype}, {elements} elements")
            timings.append(seconds)
        per_element = max((timings[1] - timings[0]) / (large - small), 0.0)
        fixed = max(timings[0] - per_element * small - dispatch_seconds / 2.0, 0.0)
        result[dtype] = {"fixed": fixed, "per_element": per_element}
    return result


def _model_signature(model: keras.Model) -> Any:
    try:
        return json.loads(json.dumps(model.get_config(), sort_keys=True, default=repr))
    except Exception:
        return {"fingerprint": model_fingerprint(model)}


def _clone_for_step(model: keras.Model, dtype: str) -> keras.Model:
    clone = keras.models.clone_model(model)
    for _, layer in layer_paths(clone).items():
        try:
            layer.dtype_policy = POLICY_FOR_DTYPE[dtype]
        except Exception:
            pass
    return clone


def _step_optimizer(model: keras.Model):
    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", None) or optimizer
    if inner is None:
        return keras.optimizers.Adam()
    return inner.__class__.from_config(inner.get_config())


def _step_function(model: keras.Model, batch: Any, dtype: str, jit_compile: bool):
    """Returns a zero-argument function running one training step of a uniform-`dtype` copy."""
    inputs = _input_part(batch)
    targets = batch[1] if isinstance(batch, tuple) and len(batch) >= 2 else None
    clone = _clone_for_step(model, dtype)
    loss = getattr(model, "loss", None) if targets is not None else None
    if targets is None or loss is None:
        outputs = clone(_slice_batch(inputs, 1))
        batch_size = _batch_size_of(inputs)
        targets = keras.tree.map_structure(
            lambda t: (
                np.random.default_rng(0)
                .standard_normal((batch_size, *t.shape[1:]))
                .astype("float32")
            ),
            outputs,
        )
        loss = "mse"
    optimizer = _step_optimizer(model)
    if dtype == "float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    clone.compile(optimizer=optimizer, loss=loss, jit_compile=jit_compile)
    # On JAX the batch goes to the device once, as a prefetching input pipeline would.
    inputs, targets = _timing_backend("measure_train_steps()").to_device((inputs, targets))
    return lambda: clone.train_on_batch(inputs, targets)


def _time_interleaved(functions: Mapping[str, Any], repeats: int, warmup: int) -> dict[str, float]:
    """Times several functions in alternating rounds; returns each one's median seconds.

    Interleaving keeps their ratios honest on a machine whose load drifts. A
    function whose first timed call takes over half a second is timed twice at most.
    """
    for function in functions.values():
        for _ in range(warmup):
            function()
    samples: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(max(repeats, 1)):
        for name, function in functions.items():
            if len(samples[name]) >= 2 and samples[name][0] > 0.5:
                continue
            start = time.perf_counter()
            function()
            samples[name].append(time.perf_counter() - start)
    return {name: float(statistics.median(values)) for name, values in samples.items()}


def measure_train_steps(
    model: keras.Model,
    batch: Any,
    dtypes: Sequence[str] = (FLOAT32,),
    repeats: int = 5,
    jit_compile: bool = False,
    warmup: int = 2,
) -> dict[str, float]:
    """Times whole training steps of copies of `model` under uniform policies, interleaved.

    Each copy (fresh weights, same architecture, every layer under the dtype's
    `mixed_*` policy) is compiled with the model's optimizer class (Adam if
    none; float16 wrapped in `LossScaleOptimizer`) and loss (mean squared error
    on random targets when the batch has no targets or the model is not
    compiled), so the user's model, its weights and optimizer state are
    untouched. The copies are timed in alternating rounds, so that their ratios
    hold on a loaded machine. Works on the TensorFlow and JAX backends (Keras'
    own `train_on_batch`; on JAX the batch is placed on the device once).

    Args:
        model: a Functional or Sequential model.
        batch: `x` or `(x, y)`.
        dtypes: uniform compute dtypes, one copy each.
        repeats: timed rounds (median), after the warm-up steps; a copy whose
            step takes over half a second is timed twice at most.
        jit_compile: whether to compile the steps with XLA.
        warmup: untimed steps of each copy first (the first traces its step).

    Returns:
        `{dtype: median seconds of one train_on_batch step}`.

    Raises:
        BackendError: on a Keras backend other than TensorFlow or JAX.

    Example:

    ```python
    steps = autoprec.cost.measure_train_steps(model, (x[:32], y[:32]), ["float32", "bfloat16"])
    steps["bfloat16"] / steps["float32"]
    ```
    """
    _timing_backend("measure_train_steps()")
    names = [canonical_dtype(dtype) for dtype in dtypes]
    functions = {dtype: _step_function(model, batch, dtype, jit_compile) for dtype in names}
    return _time_interleaved(functions, repeats, warmup)


def measure_train_step(
    model: keras.Model,
    batch: Any,
    dtype: str = FLOAT32,
    repeats: int = 5,
    jit_compile: bool = False,
    warmup: int = 2,
) -> float:
    """Times one whole training step of a copy of `model` under a uniform policy.

    One dtype of `measure_train_steps`; see there for how the copy is made.

    Args:
        model: a Functional or Sequential model.
        batch: `x` or `(x, y)`.
        dtype: uniform compute dtype of the copy.
        repeats: timed steps (median), after the warm-up steps; at most 2 when
            one step takes over half a second.
        jit_compile: whether to compile the step with XLA.
        warmup: untimed steps first (the first one traces the step function).

    Returns:
        Median seconds of one `train_on_batch` step.
    """
    dtype = canonical_dtype(dtype)
    return measure_train_steps(model, batch, [dtype], repeats, jit_compile, warmup)[dtype]


def _measurable(cost: LayerCost) -> bool:
    return not cost.is_free and "counted in" not in cost.note


def calibrate(
    model: keras.Model,
    batch: Any,
    dtypes: Sequence[str] = COMPUTE_DTYPES,
    repeats: int = 5,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    measure_model_step: bool | str | Sequence[str] = True,
    hardware: hardware_module.HardwareProfile | str | None = None,
    use_cache: bool = True,
) -> CostTable:
    """Measures every layer's forward+backward time in each dtype on this device.

    Runs on Keras' TensorFlow backend (`tf.function`, XLA when the model is
    compiled with `jit_compile=True`) and on its JAX backend (`jax.jit`, on
    JAX's default device: a GPU when JAX has one; TensorFlow is not needed).
    Each computing layer is rebuilt alone from its config with the dtype's
    policy, built on the input shapes it sees in the model (with the batch's
    size), and its compiled forward+backward on random inputs is timed (two
    warm-up calls, median of `repeats`). Layers that cannot be rebuilt get the
    roofline prediction, flagged in `source`. Casts between float32 and each
    16-bit dtype are timed too, and with `measure_model_step` whole training
    steps of copies of the model under uniform policies, in alternating rounds
    (`measure_train_steps`): float32 and each 16-bit dtype of `dtypes`. A dtype
    `hardware` marks slow (float16 on a CPU under TensorFlow) is timed alone
    after one warm-up step (twice when a step takes over half a second): its
    layers can run slower inside the whole step than alone (ResNet50 in float16
    on a CPU: 1.4x; float16 kernels there slow down on values in float16's
    subnormal range, which real gradients reach and random timing inputs do
    not), so its per-layer sum alone would predict it badly. Leave it out of
    `dtypes` to skip it. The part
    of the residual (measured step minus summed layers and casts) common to all
    measured dtypes becomes `step_overhead_seconds`; the rest becomes a per-dtype
    `layer_time_scale_by_dtype`, so that `estimate` of each measured uniform plan
    equals its measured step and mixed plans weigh each dtype's correction by
    the layer time spent in it. Measurements are cached per device, framework
    versions and layer signature (class, config, input shapes, batch), whole
    steps per model signature, input shapes and dtype, so a second call
    measures nothing.

    Args:
        model: a built Keras model.
        batch: a training batch, `x` or `(x, y)`; its size is the batch size timed.
        dtypes: compute dtypes to time.
        repeats: timed repetitions per measurement (median).
        cache_dir: cache folder; default `$AUTOPREC_CACHE_DIR` or `~/.cache/autoprec`.
        progress: show a progress bar.
        measure_model_step: which whole training steps to time: `True` (or
            `"all"`) every dtype of `dtypes`, a slow one alone after one warm-up
            step; a list of dtypes (from `dtypes`); `"fast"` only those
            `hardware` runs natively; `False` none.
        hardware: profile for fallback predictions; default the detected device.
        use_cache: read and write the cache.

    Returns:
        A `CostTable` with `source="measured"`; `stats` counts `"timed"`,
        `"cached"` and `"fallback"` layer measurements, and `"model_step"`
        whole steps (`"model_steps_timed"` of them timed now).

    Raises:
        PlanError: if `measure_model_step` names a dtype not in `dtypes`.
        BackendError: on a Keras backend other than TensorFlow or JAX (torch).

    Example:

    ```python
    x, y = data
    costs = autoprec.calibrate(model, (x[:32], y[:32]))
    print(costs.summary())
    ```
    """
    _timing_backend("calibrate()")
    dtypes = [canonical_dtype(dtype) for dtype in dtypes]
    if FLOAT32 not in dtypes:
        dtypes = [FLOAT32, *dtypes]
    profile = _resolve_hardware(hardware)
    inputs = _input_part(batch)
    batch_size = _batch_size_of(inputs)
    trace = trace_model(model, inputs)
    counts = count_costs(model, trace)
    paths = layer_paths(model)
    versions = _versions()
    device = (
        f"{profile.display_name} ({os.cpu_count()} cpus)"
        if profile.kind == "cpu"
        else (profile.display_name)
    )
    directory = (
        (Path(cache_dir) if cache_dir is not None else default_cache_dir()) if (use_cache) else None
    )
    cache = _Cache(directory, device, versions)
    jit_compile = bool(getattr(model, "jit_compile", False) is True)
    stats = {"timed": 0, "cached": 0, "fallback": 0}
    # Whole steps are timed first, in a process not yet crowded by per-layer functions.
    measured_steps = _measure_whole_steps(
        model,
        batch,
        _whole_step_dtypes(measure_model_step, dtypes, profile),
        profile,
        _StepTiming(cache, repeats, jit_compile, stats),
    )

    dispatch_key = cache.key({"dispatch": True})
    dispatch_seconds = cache.get(dispatch_key)
    if dispatch_seconds is None:
        dispatch_seconds = _time_empty_function(repeats)
        cache.put(dispatch_key, dispatch_seconds, "empty compiled call")

    work = [path for path, cost in counts.items() if _measurable(cost)]
    bar = (
        keras.utils.Progbar(len(work) * len(dtypes), unit_name="timing")
        if (progress and work)
        else None
    )
    layers: dict[str, LayerCostRecord] = {}
    for path, cost in counts.items():
        if path not in work:
            layers[path] = _record(cost, dict.fromkeys(dtypes, 0.0), batch_size, dtypes, "measured")
            continue
        seconds, source = _measure_layer(
            paths[path],
            trace.calls[path],
            cost,
            dtypes,
            batch_size,
            repeats,
            cache,
            stats,
            profile,
            jit_compile,
            dispatch_seconds,
            bar,
        )
        layers[path] = _record(cost, seconds, batch_size, dtypes, source)

    _subtract_children(layers, counts)
    table = CostTable(
        device=device,
        source="measured",
        batch_size=batch_size,
        layers=layers,
        edges=[(edge.producer, edge.consumer, edge.elements_per_sample) for edge in trace.edges],
        cast_seconds=_measure_casts(dtypes, cache, repeats, dispatch_seconds),
        layer_fixed_seconds=0.0,
        memory_bytes=profile.memory_bytes,
        model_fingerprint=model_fingerprint(model),
        versions=versions,
        stats=stats,
    )
    _attribute_step_overhead(table, measured_steps)
    return table


def _measure_layer(
    layer,
    calls,
    cost,
    dtypes,
    batch_size,
    repeats,
    cache,
    stats,
    profile,
    jit_compile,
    dispatch_seconds,
    bar,
) -> tuple[dict[str, float | None], str]:
    """Measures (or reads from cache, or predicts as a fallback) one layer in each dtype."""
    seconds: dict[str, float | None] = {}
    sources = set()
    for dtype in dtypes:
        total = 0.0
        for call in calls:
            key = cache.key({"layer": _layer_signature(layer, call, batch_size), "dtype": dtype})
            value = cache.get(key)
            if value is not None:
                stats["cached"] += 1
                sources.add("cached")
            else:
                try:
                    value = _time_layer(layer, call, dtype, batch_size, repeats, jit_compile)
                    value = max(value - dispatch_seconds, 0.05 * value)
                    cache.put(key, value, f"{call.class_name} {call.path} {dtype}")
                    stats["timed"] += 1
                    sources.add("measured")
                except Exception as error:  # noqa: BLE001 - any failure falls back, flagged
                    predicted = predicted_layer_seconds(cost, profile, dtype, batch_size)
                    stats["fallback"] += 1
                    sources.add(f"predicted (fallback: {type(error).__name__}: {error})"[:200])
                    if predicted is None:
                        total = math.inf
                        break
                    value = predicted / max(len(calls), 1)
            total += value
        seconds[dtype] = None if math.isinf(total) else total
        if bar is not None:
            bar.add(1)
    fallback = [source for source in sources if source.startswith("predicted")]
    if fallback:
        return seconds, fallback[0]
    return seconds, "measured" if "measured" in sources else "cached"


def _subtract_children(layers: dict[str, LayerCostRecord], counts: Mapping[str, LayerCost]) -> None:
    """Removes the children's time from containers timed whole (MultiHeadAttention).

    A standalone `MultiHeadAttention` runs its projections too; those are timed
    as its inner `EinsumDense` layers, so the container keeps only the rest.
    """
    for path, record in layers.items():
        prefix = path + "/"
        children = [other for other in layers if other.startswith(prefix)]
        if not children or not _measurable(counts[path]) or record.source.startswith("predicted"):
            continue
        for dtype, seconds in record.seconds.items():
            if seconds is None:
                continue
            inner = sum(layers[child].seconds.get(dtype) or 0.0 for child in children)
            record.seconds[dtype] = max(seconds - inner, 0.1 * seconds)


def _whole_step_dtypes(
    requested: bool | str | Sequence[str],
    dtypes: Sequence[str],
    profile: hardware_module.HardwareProfile,
) -> list[str]:
    """Returns the dtypes whose uniform whole step `calibrate` times, float32 first."""
    if requested is False or requested is None:
        return []
    keyword = requested.strip().lower() if isinstance(requested, str) else None
    if requested is True or keyword == "all":
        return list(dtypes)
    if keyword == "fast":
        return [dtype for dtype in dtypes if profile.support(dtype) == hardware_module.FAST]
    names = [requested] if isinstance(requested, str) else list(requested)
    chosen = {canonical_dtype(name, "measure_model_step") for name in names}
    missing = sorted(chosen - set(dtypes))
    if missing:
        raise PlanError(
            f"measure_model_step names {', '.join(missing)}, which calibrate() does not time "
            f"per layer (dtypes={list(dtypes)}); add it to dtypes, or pass True, 'fast' or False."
        )
    return [dtype for dtype in dtypes if dtype in chosen]


@dataclasses.dataclass
class _StepTiming:
    """Where and how `calibrate` times whole steps: cache, repeats, XLA, counters."""

    cache: _Cache
    repeats: int
    jit_compile: bool
    stats: dict[str, int]


def _measure_whole_steps(
    model: keras.Model,
    batch: Any,
    dtypes: Sequence[str],
    profile: hardware_module.HardwareProfile,
    timing: _StepTiming,
) -> dict[str, float]:
    """Returns `{dtype: measured whole-step seconds}`, cached; empty if the model cannot be copied.

    The dtypes the device runs fast are timed together, interleaved (all again
    when one is missing from the cache, so their ratios come from one run);
    each slow one alone after one warm-up step (twice when a step takes over
    half a second).
    """
    timing.stats.update({"model_step": 0, "model_steps_timed": 0})
    keys = {dtype: _whole_step_key(model, batch, dtype, timing) for dtype in dtypes}
    measured = {dtype: timing.cache.get(key) for dtype, key in keys.items()}
    fast = [dtype for dtype in dtypes if profile.support(dtype) == hardware_module.FAST]
    groups = [(fast, max(timing.repeats, 3), 2)] if any(measured[d] is None for d in fast) else []
    groups += [
        ([dtype], max(timing.repeats, 3), 1)
        for dtype in dtypes
        if dtype not in fast and measured[dtype] is None
    ]
    for group, repeats, warmup in groups:
        try:
            timed = measure_train_steps(model, batch, group, repeats, timing.jit_compile, warmup)
        except Exception:  # noqa: BLE001 - subclassed models cannot be cloned: no correction
            return {}
        for dtype, seconds in timed.items():
            timing.cache.put(keys[dtype], seconds, f"whole {dtype} train step")
            measured[dtype] = seconds
            timing.stats["model_steps_timed"] += 1
    result = {dtype: seconds for dtype, seconds in measured.items() if seconds is not None}
    timing.stats["model_step"] = len(result)
    return result


def _whole_step_key(model: keras.Model, batch: Any, dtype: str, timing: _StepTiming) -> str:
    """Returns the cache key of one uniform-`dtype` whole step of `model` on `batch`'s shapes."""
    shapes = [list(t.shape) for t in _flat_tensors(batch)]
    return timing.cache.key(
        {
            "model_step": _model_signature(model),
            "shapes": shapes,
            "jit": timing.jit_compile,
            "dtype": dtype,
        }
    )


#: Smallest per-dtype layer-time scale (guards against a step measured absurdly fast).
_MIN_TIME_SCALE = 0.05


def _uniform_step_parts(table: CostTable, dtype: str) -> tuple[float, float]:
    """Returns `(summed raw layer seconds, cast seconds)` of a uniform `dtype` plan.

    Casts are those `estimate` counts for a uniform plan: model inputs arrive
    in float32.
    """
    layers = 0.0
    for record in table.layers.values():
        seconds = record.seconds.get(dtype)
        if seconds is None:
            return math.inf, 0.0
        layers += seconds
    casts = 0.0
    if dtype != FLOAT32:
        casts = sum(
            table.cast_cost(elements * table.batch_size, dtype)
            for producer, _, elements in table.edges
            if producer is None
        )
    return layers, casts


def _attribute_step_overhead(table: CostTable, measured: Mapping[str, float]) -> None:
    """Makes each measured uniform step's estimate equal its measurement.

    The residual (measured step minus summed layers and casts) that every
    measured dtype shows becomes the shared `step_overhead_seconds` (optimizer,
    loss, framework); what remains of each dtype's step is spread over its layers
    as `layer_time_scale_by_dtype[dtype]`. With float32 alone this is the
    previous behaviour: overhead when the residual is positive, else a scale.
    """
    parts = {dtype: _uniform_step_parts(table, dtype) for dtype in measured}
    parts = {dtype: part for dtype, part in parts.items() if math.isfinite(part[0])}
    if not parts:
        return
    residuals = [measured[dtype] - layers - casts for dtype, (layers, casts) in parts.items()]
    overhead = max(0.0, min(residuals))
    scales = {
        dtype: (
            max((measured[dtype] - casts - overhead) / layers, _MIN_TIME_SCALE)
            if layers > 0
            else 1.0
        )
        for dtype, (layers, casts) in parts.items()
    }
    table.step_overhead_seconds = overhead
    table.layer_time_scale = scales.get(FLOAT32, 1.0)
    table.layer_time_scale_by_dtype = scales
    table.measured_step_seconds = measured.get(FLOAT32)
    table.measured_step_seconds_by_dtype = {dtype: float(measured[dtype]) for dtype in parts}


# =========================================================================== estimate


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Predicted step time, speedup and memory of a model under a plan.

    Attributes:
        step_seconds: predicted seconds per training step (`inf`: infeasible).
        float32_step_seconds: predicted seconds per step with every layer in float32.
        speedup: `float32_step_seconds / step_seconds`.
        batch_size: samples per step.
        layer_seconds: `{path: seconds}` of each layer in its assigned dtype.
        cast_seconds: seconds spent casting at dtype boundaries.
        overhead_seconds: fixed per-step overhead (the same for every dtype).
        activation_bytes_per_sample: activations kept for backward, per sample.
        parameter_bytes: float32 master weights, their gradients and 16-bit copies.
        optimizer_bytes: optimizer state.
        memory_bytes: device memory (`None` if unknown).
        infeasible_layers: layers whose dtype the device cannot run.
        device: device name.
        source: `"measured"` or `"predicted"`.

    Example:

    ```python
    est = autoprec.estimate(model, plan, "rtx4060ti-8gb", batch_size=64)
    est.speedup, est.max_batch_size()
    ```
    """

    step_seconds: float
    float32_step_seconds: float
    speedup: float
    batch_size: int
    layer_seconds: dict[str, float]
    cast_seconds: float
    overhead_seconds: float
    activation_bytes_per_sample: float
    parameter_bytes: float
    optimizer_bytes: float
    memory_bytes: int | None
    infeasible_layers: tuple[str, ...]
    device: str
    source: str

    @property
    def fixed_memory_bytes(self) -> float:
        """Memory that does not grow with the batch: weights, gradients, optimizer state."""
        return self.parameter_bytes + self.optimizer_bytes

    @property
    def training_memory_bytes(self) -> float:
        """Estimated memory of one training step at `batch_size`."""
        return self.fixed_memory_bytes + self.activation_bytes_per_sample * self.batch_size

    def max_batch_size(self, memory_bytes: int | None = None) -> int:
        """Returns the largest batch whose training step fits in memory.

        Uses `USABLE_MEMORY_FRACTION` of the memory (the rest is left to the
        framework and workspaces).

        Args:
            memory_bytes: memory available; default the device's.

        Returns:
            The batch size (0 when not even one sample fits).
        """
        memory = memory_bytes if memory_bytes is not None else self.memory_bytes
        if memory is None:
            raise HardwareError("memory size unknown: pass memory_bytes to max_batch_size().")
        usable = memory * USABLE_MEMORY_FRACTION - self.fixed_memory_bytes
        if usable <= 0 or self.activation_bytes_per_sample <= 0:
            return 0
        return int(usable // self.activation_bytes_per_sample)


def _plan_mapping(plan: Any) -> dict[str, str]:
    if isinstance(plan, str):
        return {"*": canonical_dtype(plan, "plan")}
    layers = getattr(plan, "layers", plan)
    if not isinstance(layers, Mapping):
        raise PlanError(
            f"expected a PrecisionPlan, a {{path: dtype}} dict or a dtype name, "
            f"got {type(plan).__name__}."
        )
    return {str(path): canonical_dtype(dtype, f"plan[{path!r}]") for path, dtype in layers.items()}


def _dtype_resolver(plan: Mapping[str, str], infos: Mapping[str, LayerInfo]):
    """Returns `dtype_of(path)`: the plan's dtype, or the followed layer's, descendant's, parent's."""
    uniform = plan.get("*")
    cache: dict[str, str] = {}

    def dtype_of(path: str | None, depth: int = 0) -> str:
        if path is None:
            return FLOAT32
        if uniform is not None:
            return uniform
        if path in cache:
            return cache[path]
        result = plan.get(path)
        info = infos.get(path)
        if result is None and info is not None and info.follows and depth < 50:
            result = dtype_of(info.follows, depth + 1)
        if result is None:
            result = next(
                (dtype for other, dtype in plan.items() if other.startswith(path + "/")), None
            )
        parent = path
        while result is None and "/" in parent:
            parent = parent.rsplit("/", 1)[0]
            result = plan.get(parent)
        cache[path] = result or FLOAT32
        return cache[path]

    return dtype_of


def _optimizer_slots(model: keras.Model) -> int:
    optimizer = getattr(model, "optimizer", None)
    optimizer = getattr(optimizer, "inner_optimizer", None) or optimizer
    if optimizer is None:
        return 2
    name = type(optimizer).__name__
    if name == "SGD":
        return 1 if getattr(optimizer, "momentum", 0) else 0
    return {"Adam": 2, "AdamW": 2, "Adamax": 2, "Nadam": 2, "RMSprop": 1, "Adagrad": 1}.get(name, 2)


def _costs_for(
    model: keras.Model, costs_or_hardware: Any, batch_size: int | None, sample: Any
) -> CostTable:
    if isinstance(costs_or_hardware, CostTable):
        return costs_or_hardware
    profile = _resolve_hardware(costs_or_hardware)
    return predict_costs(model, profile, batch_size or 32, sample)


def _step_seconds(
    table: CostTable, dtype_of, batch_size: int
) -> tuple[float, dict[str, float], float, tuple[str, ...]]:
    layer_seconds = {path: table.seconds(path, dtype_of(path), batch_size) for path in table.layers}
    infeasible = tuple(path for path, value in layer_seconds.items() if math.isinf(value))
    cast_seconds = 0.0
    for producer, consumer, elements in table.edges:
        source_dtype, target_dtype = dtype_of(producer), dtype_of(consumer)
        if source_dtype != target_dtype:
            cast_dtype = target_dtype if target_dtype != FLOAT32 else source_dtype
            cast_seconds += table.cast_cost(elements * batch_size, cast_dtype)
    total = sum(layer_seconds.values()) + cast_seconds + table.step_overhead_seconds
    return total, layer_seconds, cast_seconds, infeasible


def estimate(
    model: keras.Model,
    plan: Any,
    hardware_or_costs: Any = None,
    batch_size: int | None = None,
    sample: Any = None,
) -> Estimate:
    """Estimates a plan's training step time, speedup over float32 and memory.

    The step is the sum of each layer's cost in its assigned dtype (scaled by
    the table's correction for that dtype, `CostTable.time_scale`), casts where
    neighbouring layers differ in dtype, and the table's fixed per-step
    overhead. For a table from `calibrate`, a uniform plan in a dtype whose
    whole step was measured is estimated at that measured step; a mixed plan
    weighs each dtype's correction by the layer time spent in it.

    Args:
        model: the built Keras model the plan is for.
        plan: a `PrecisionPlan` (anything with a `.layers` mapping), a
            `{path: dtype}` dict, or one dtype name for a uniform plan. Layers the
            plan does not name take the dtype of the layer they follow, of their
            first named descendant or of their nearest named parent, else float32.
        hardware_or_costs: a `CostTable` (from `calibrate` or `predict_costs`), a
            `HardwareProfile`, a profile name, or `None`/`"local"` for this device.
        batch_size: samples per step; default the table's batch size (32 for a
            prediction from a hardware profile).
        sample: model inputs for shape tracing (subclassed models).

    Returns:
        An `Estimate`.

    Example:

    ```python
    est = autoprec.estimate(model, {"dense": "bfloat16"}, "rtx4090", batch_size=64)
    print(est.speedup, est.max_batch_size())
    ```
    """
    table = _costs_for(model, hardware_or_costs, batch_size, sample)
    batch = int(batch_size or table.batch_size)
    mapping = _plan_mapping(plan)
    infos = describe_model(model)
    dtype_of = _dtype_resolver(mapping, infos)
    step, layer_seconds, cast_seconds, infeasible = _step_seconds(table, dtype_of, batch)
    float32_step, _, _, _ = _step_seconds(table, lambda path: FLOAT32, batch)

    activation_bytes = sum(
        record.saved_elements_per_sample * _ITEMSIZE[dtype_of(path)]
        for path, record in table.layers.items()
    )
    activation_bytes += sum(
        elements * 4 for producer, _, elements in table.edges if producer is None
    )
    parameters = sum(int(np.prod(weight.shape)) for weight in model.weights)
    trainable = sum(int(np.prod(weight.shape)) for weight in model.trainable_weights)
    half_copies = sum(
        record.weight_elements * _ITEMSIZE[dtype_of(path)]
        for path, record in table.layers.items()
        if dtype_of(path) != FLOAT32
    )
    return Estimate(
        step_seconds=step,
        float32_step_seconds=float32_step,
        speedup=0.0 if math.isinf(step) or step <= 0 else float32_step / step,
        batch_size=batch,
        layer_seconds=layer_seconds,
        cast_seconds=cast_seconds,
        overhead_seconds=table.step_overhead_seconds,
        activation_bytes_per_sample=float(activation_bytes),
        parameter_bytes=float(parameters * 4 + trainable * 4 + half_copies),
        optimizer_bytes=float(trainable * 4 * _optimizer_slots(model)),
        memory_bytes=table.memory_bytes,
        infeasible_layers=infeasible,
        device=table.device,
        source=table.source,
    )
