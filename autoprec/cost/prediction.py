"""The prediction: each layer's per-sample FLOPs and elements (`LayerCost`, a formula per layer
kind) and its roofline seconds per dtype on a `HardwareProfile` (`predict_costs`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import keras

from .._core.data import input_part
from .._core.dtypes import (
    BFLOAT16,
    FLOAT8,
    FLOAT32,
    PLAN_DTYPES,
    canonical_dtype,
    canonical_float8_source,
    float8_eligible,
)
from ..hardware import SLOW, UNSUPPORTED, HardwareProfile, resolve_hardware
from ..layers import PASS_THROUGH_CLASSES, LayerInfo, describe_model, layer_paths, model_fingerprint
from .layer_calls import LayerCall, ModelTrace, TensorSpec, element_count, trace_model
from .steps import framework_versions
from .table import CostTable, LayerCostRecord

#: Bytes per element of each compute dtype.
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
#: Bytes per element of a float8 tensor (E4M3 or E5M2).
FLOAT8_ITEMSIZE = 1
#: Tensors a float8 matrix product quantizes each step, each with its scale and amax history:
#: inputs and kernel (E4M3), output gradients (E5M2) (Keras' `Dense._float8_call`).
FLOAT8_QUANTIZED_TENSORS = 3
#: Kernel launches a float8 matrix product adds per step: per quantized tensor a quantize pass, an
#: amax reduction and an amax history and scale update (fused compilers launch about 6).
FLOAT8_EXTRA_KERNELS = 3 * FLOAT8_QUANTIZED_TENSORS
#: Length of each amax history (`QuantizedFloat8DTypePolicy.default_amax_history_length`).
FLOAT8_AMAX_HISTORY = 1024
#: Vector FLOPs per quantized element: divide by the scale, clip (2), and the amax's abs and max.
FLOAT8_QUANTIZE_FLOPS = 5


@dataclasses.dataclass(frozen=True)
class LayerCost:
    """Per-sample arithmetic and memory traffic of one layer, independent of dtype."""

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
    float8_matmuls: int = 0
    float8_dims: tuple[int, ...] = ()
    float8_quantized_elements: float = 0.0
    float8_kernel_elements: int = 0

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

    @property
    def has_float8_path(self) -> bool:
        """Whether the layer's matrix products can run in float8 (`Dense`, `EinsumDense`)."""
        return self.float8_matmuls > 0

    def bytes_moved(self, dtype: str, batch_size: int, float8_source: str = BFLOAT16) -> float:
        """Returns bytes read and written forward+backward for a batch in `dtype`."""
        if dtype == FLOAT8:
            return self.bytes_moved(float8_source, batch_size) + self.float8_quantize_bytes(
                batch_size, float8_source
            )
        itemsize = ITEMSIZE[dtype]
        activation_bytes = 3 * self.activation_elements * batch_size * itemsize
        weight_cast = 0 if dtype == FLOAT32 else 2 * itemsize
        return activation_bytes + self.weight_elements * (4 + itemsize + weight_cast + 4)

    def float8_quantized_values(self, batch_size: int) -> float:
        """Returns the values the float8 path quantizes in one step of `batch_size` samples."""
        return self.float8_quantized_elements * batch_size + self.float8_kernel_elements

    def float8_quantize_bytes(self, batch_size: int, float8_source: str = BFLOAT16) -> float:
        """Returns the bytes the float8 path's quantize work moves in one step."""
        per_value = 2 * ITEMSIZE[float8_source] + FLOAT8_ITEMSIZE
        histories = self.float8_matmuls * FLOAT8_QUANTIZED_TENSORS * FLOAT8_AMAX_HISTORY * 4 * 3
        return self.float8_quantized_values(batch_size) * per_value + histories


#: FLOPs per element of common activations (forward).
ACTIVATION_FLOPS: dict[str, int] = {
    "linear": 0, "relu": 1, "relu6": 2, "leaky_relu": 2, "hard_tanh": 2, "elu": 4, "selu": 5,
    "celu": 5, "sigmoid": 4, "hard_sigmoid": 3, "tanh": 4, "softplus": 4, "softsign": 3, "silu": 5,
    "swish": 5, "hard_silu": 5, "hard_swish": 5, "gelu": 8, "mish": 8, "exponential": 1,
    "log_sigmoid": 5, "softmax": 5, "log_softmax": 5,
}  # fmt: skip
_DEFAULT_ACTIVATION_FLOPS = 4

#: Pass-through layers (`autoprec.layers.PASS_THROUGH_CLASSES`) that only view their input: no
#: FLOPs, no copy; the others have their own formula below, or copy their elements.
VIEW_CLASSES = frozenset({"Flatten", "Reshape", "InputLayer", "Identity"})
#: Pass-through layers counted at two FLOPs per element.
DROPOUT_CLASSES = frozenset({
    "Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianDropout",
    "GaussianNoise", "AlphaDropout",
})  # fmt: skip
#: Element-wise merges of their inputs.
MERGE_CLASSES = frozenset({"Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum"})
#: Activation layers, counted by their activation's formula.
ACTIVATION_CLASSES = frozenset({"Activation", "ReLU", "Softmax", "LeakyReLU", "PReLU", "ELU"})
#: Every other pass-through layer: copies its elements without arithmetic.
COPY_CLASSES = frozenset(
    name
    for name in PASS_THROUGH_CLASSES - VIEW_CLASSES - DROPOUT_CLASSES
    if name not in MERGE_CLASSES and name not in ACTIVATION_CLASSES and "Pooling" not in name
)
_NORMALISATION_CLASSES = frozenset({
    "BatchNormalization", "LayerNormalization", "GroupNormalization", "UnitNormalization",
    "RMSNormalization", "SpectralNormalization",
})  # fmt: skip
_RNN_GATES = {"LSTM": 4, "GRU": 3, "SimpleRNN": 1, "ConvLSTM1D": 4, "ConvLSTM2D": 4}
_RNN_VECTOR_FLOPS_PER_UNIT = {"LSTM": 10, "GRU": 9, "SimpleRNN": 2}
_CONVOLUTION = re.compile(r"^((Conv|DepthwiseConv|SeparableConv)\d?D(Transpose)?|Convolution2D)$")


def _activation_flops(activation: Any) -> int:
    name = getattr(activation, "__name__", None) or str(activation)
    return ACTIVATION_FLOPS.get(name, _DEFAULT_ACTIVATION_FLOPS)


def _bias_and_activation(layer, output_elements: float) -> float:
    bias = getattr(layer, "use_bias", False) or getattr(layer, "bias", None) is not None
    activation = getattr(layer, "activation", None)
    per_element = (1 if bias else 0) + (0 if activation is None else _activation_flops(activation))
    return float(per_element * output_elements)


def _elements(specs: Sequence[TensorSpec]) -> float:
    return float(sum(spec.elements_per_sample() for spec in specs))


def _io_elements(call: LayerCall) -> float:
    float_inputs = [spec for spec in call.inputs if "float" in spec.dtype]
    return _elements(float_inputs) + _elements(call.outputs)


def _matmul_layer(
    call: LayerCall, layer, matmul: float, dims: Sequence[int], output: float
) -> dict[str, Any]:
    vector = _bias_and_activation(layer, output)
    return {
        "matmul_flops": matmul,
        "vector_flops": vector,
        "backward_matmul_flops": 2 * matmul,
        "backward_vector_flops": vector,
        "activation_elements": _io_elements(call),
        "saved_elements": output + _elements(call.inputs),
        "weight_elements": weight_count(layer.trainable_weights),
        "matmul_dims": tuple(int(dim) for dim in dims),
        "kernels": 3 + (1 if vector else 0) * 2,
    }


def weight_count(weights: Sequence[Any]) -> int:
    """Returns the elements of `weights`, without float8 layers' scales and amax histories."""
    return sum(
        element_count(weight.shape)
        for weight in weights
        if not getattr(weight, "overwrite_with_gradient", False)
    )


def _float8_counts(
    call: LayerCall, layer, contraction: int, features: int, output: float
) -> dict[str, Any]:
    """Returns what the float8 path of one `Dense`/`EinsumDense` call quantizes."""
    if not float8_eligible(type(layer).__name__):
        return {}
    return {
        "float8_matmuls": 1,
        "float8_dims": (int(contraction), int(features)),
        "float8_quantized_elements": float(call.inputs[0].elements_per_sample()) + output,
        "float8_kernel_elements": element_count(layer.kernel.shape),
    }


def _count_dense(call: LayerCall, layer) -> dict[str, Any]:
    features_in, units = int(call.inputs[0].shape[-1]), int(layer.units)
    rows = call.inputs[0].elements_per_sample() // features_in
    output = rows * units
    matmul = 2.0 * rows * features_in * units
    counts = _matmul_layer(call, layer, matmul, (features_in, units), output)
    counts.update(_float8_counts(call, layer, features_in, units, output))
    return counts


def _einsum_flops(equation: str, shape_a: Sequence[int], shape_b: Sequence[int]) -> float:
    """Returns 2 x the product of every index size of a two-operand einsum."""
    operands, _, _ = equation.replace(" ", "").partition("->")
    sizes: dict[str, int] = {}
    for term, shape in zip(operands.split(","), (shape_a, shape_b)):
        if "..." in term:
            head, _, tail = term.partition("...")
            ellipsis_rank = len(shape) - len(head) - len(tail)
            sizes["..."] = max(
                sizes.get("...", 1), element_count(shape[len(head) : len(head) + ellipsis_rank])
            )
            letters = list(head) + list(tail)
            dims = list(shape[: len(head)]) + list(shape[len(shape) - len(tail) :])
        else:
            letters, dims = list(term), list(shape)
        for letter, dim in zip(letters, dims):
            sizes[letter] = int(dim)
    return 2.0 * element_count(sizes.values())


def _einsum_gemm_dims(equation: str, kernel_shape: Sequence[int]) -> tuple[int, int]:
    """Returns `(contraction, output features)` of an input-kernel einsum seen as one GEMM."""
    operands, _, output = equation.replace(" ", "").partition("->")
    inputs_term, _, kernel_term = operands.partition(",")
    contraction = features = 1
    for letter, dim in zip(kernel_term, kernel_shape):
        if letter not in output:
            contraction *= int(dim)
        elif letter not in inputs_term:
            features *= int(dim)
    return contraction, features


def _count_einsum_dense(call: LayerCall, layer) -> dict[str, Any]:
    kernel_shape = tuple(int(dim) for dim in layer.kernel.shape)
    matmul = _einsum_flops(layer.equation, call.inputs[0].concrete_shape(1), kernel_shape)
    output = _elements(call.outputs)
    counts = _matmul_layer(call, layer, matmul, kernel_shape, output)
    contraction, features = _einsum_gemm_dims(layer.equation, kernel_shape)
    counts.update(_float8_counts(call, layer, contraction, features, output))
    return counts


def _count_conv(call: LayerCall, layer) -> dict[str, Any]:
    kind = next(
        (kind for kind in ("Depthwise", "Separable", "Transpose") if kind in type(layer).__name__),
        "conv",
    )
    axis = 1 if getattr(layer, "data_format", "channels_last") == "channels_first" else -1
    inputs = call.inputs[0]
    output = _elements(call.outputs)
    in_channels = int(inputs.shape[axis])
    window = element_count(layer.kernel_size)
    groups = int(getattr(layer, "groups", 1) or 1)
    if kind == "conv":
        filters = int(layer.filters)
        positions = output / filters
        matmul = 2.0 * positions * filters * window * in_channels / groups
        return _matmul_layer(call, layer, matmul, (in_channels // groups, filters), output)
    if kind == "Transpose":
        filters = int(layer.filters)
        input_positions = inputs.elements_per_sample() / in_channels
        matmul = 2.0 * input_positions * in_channels * window * filters
        return _matmul_layer(call, layer, matmul, (in_channels, filters), output)
    multiplier = int(getattr(layer, "depth_multiplier", 1) or 1)
    if kind == "Depthwise":
        depthwise = 2.0 * output * window
        counts = _matmul_layer(call, layer, 0.0, (), output)
    else:  # separable: a depthwise pass, then a pointwise matmul
        filters = int(layer.filters)
        positions = output / filters
        depthwise = 2.0 * positions * in_channels * multiplier * window
        pointwise = 2.0 * positions * in_channels * multiplier * filters
        dims = (in_channels * multiplier, filters)
        counts = _matmul_layer(call, layer, pointwise, dims, output)
        counts["activation_elements"] += 2 * positions * in_channels * multiplier
    counts["vector_flops"] += depthwise
    counts["backward_vector_flops"] += 2 * depthwise
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
        "weight_elements": weight_count(layer.trainable_weights),
        "matmul_dims": (features, units),
        "kernels": 6 * steps,
    }


def _count_embedding(call: LayerCall, layer) -> dict[str, Any]:
    output = _elements(call.outputs)
    return {
        "backward_vector_flops": output,
        "activation_elements": output + _elements(call.inputs),
        "kernels": 3,
    }


def _count_normalisation(call: LayerCall, layer) -> dict[str, Any]:
    counts = _count_elementwise(call, 8.0)
    counts.update(backward_vector_flops=2 * counts["vector_flops"], kernels=6)
    return {**counts, "weight_elements": weight_count(layer.trainable_weights)}


def _count_pooling(call: LayerCall, layer) -> dict[str, Any]:
    class_name = type(layer).__name__
    output = _elements(call.outputs)
    if class_name.startswith("Global"):
        flops = _elements(call.inputs)
    else:
        flops = output * element_count(getattr(layer, "pool_size", (1,)))
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
    snake_case = re.sub(r"(?<!^)(?=[A-Z])", "_", class_name).lower()
    activation = layer.activation if class_name == "Activation" else snake_case
    return _count_elementwise(call, _activation_flops(activation))


def count_call(
    call: LayerCall, layer: Any, info: LayerInfo | None, parent_class: str
) -> dict[str, Any]:
    """Returns the cost fields of one call of `layer` (empty for free layers)."""
    class_name = type(layer).__name__
    if class_name == "MultiHeadAttention":
        return _count_attention(call, layer)
    if class_name in _RNN_GATES:
        return _count_rnn(call, layer)
    if class_name.endswith("Cell") or parent_class in _RNN_GATES:
        return {"note": "counted in its recurrent layer"}
    if (info is not None and info.is_container) or class_name in VIEW_CLASSES:
        return {}
    if class_name == "Dense":
        return _count_dense(call, layer)
    if class_name == "EinsumDense":
        return _count_einsum_dense(call, layer)
    if _CONVOLUTION.match(class_name):
        return _count_conv(call, layer)
    if class_name == "Embedding":
        return _count_embedding(call, layer)
    if class_name in _NORMALISATION_CLASSES:
        return _count_normalisation(call, layer)
    if "Pooling" in class_name:
        return _count_pooling(call, layer)
    if class_name in MERGE_CLASSES:
        return _count_elementwise(call, max(len(call.inputs) - 1, 1))
    if class_name in DROPOUT_CLASSES or class_name in ("Rescaling", "Normalization"):
        return _count_elementwise(call, 2)
    if class_name in COPY_CLASSES:
        return {"activation_elements": _io_elements(call), "kernels": 2}
    if class_name in ACTIVATION_CLASSES:
        return _count_activation_layer(call, layer)
    return _count_elementwise(call, 1, note=f"estimated: no formula for {class_name}")


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
        parent = path.rpartition("/")[0]
        parent_class = type(paths[parent]).__name__ if parent in paths else ""
        counts = [
            count_call(call, layer, infos.get(path), parent_class)
            for call in trace.calls.get(path, ())
        ]
        result[path] = _merge_counts(path, type(layer).__name__, counts)
    return result


#: Fraction of peak FLOP/s a matmul/conv reaches in the roofline prediction.
MATMUL_EFFICIENCY = 0.6
#: Fraction of float32 peak that vector (elementwise) arithmetic reaches.
VECTOR_EFFICIENCY = 0.25


def predicted_layer_seconds(
    cost: LayerCost,
    hardware: HardwareProfile,
    dtype: str,
    batch_size: int,
    float8_source: str = BFLOAT16,
) -> float | None:
    """Returns roofline forward+backward seconds of one layer in `dtype` (`None`: infeasible); a
    float8 layer's other work runs in `float8_source`, plus its scaling work."""
    float8 = dtype == FLOAT8
    source = canonical_float8_source(float8_source) if float8 else dtype
    support = hardware.support(source)
    if support == UNSUPPORTED or (
        float8 and not (cost.has_float8_path and hardware.supports_float8)
    ):
        return None
    if cost.is_free:
        return 0.0
    aligned = all(dim % max(hardware.alignment, 1) == 0 for dim in cost.matmul_dims)
    rate = hardware.peak_flops(source if aligned else FLOAT32)
    if float8 and all(dim % max(hardware.float8_alignment, 1) == 0 for dim in cost.float8_dims):
        rate = hardware.peak_flops(FLOAT8)
    vector_flops = (cost.vector_flops + cost.backward_vector_flops) * batch_size
    matmul_flops = (cost.matmul_flops + cost.backward_matmul_flops) * batch_size
    compute_seconds = matmul_flops / (rate * MATMUL_EFFICIENCY) + vector_flops / (
        hardware.float32_flops * VECTOR_EFFICIENCY
    )
    seconds = max(compute_seconds, cost.bytes_moved(source, batch_size) / hardware.memory_bandwidth)
    if support == SLOW:
        seconds *= hardware.slow_penalty
    seconds += max(cost.kernels, 1) * hardware.op_overhead_seconds
    return seconds + (
        float8_quantize_seconds(cost, hardware, batch_size, source) if float8 else 0.0
    )


def float8_quantize_seconds(
    cost: LayerCost, hardware: HardwareProfile, batch_size: int, float8_source: str = BFLOAT16
) -> float:
    """Returns the seconds a float8 layer's scaling work adds to one step."""
    vector_rate = hardware.float32_flops * VECTOR_EFFICIENCY
    flops = cost.float8_quantized_values(batch_size) * FLOAT8_QUANTIZE_FLOPS
    bytes_moved = cost.float8_quantize_bytes(batch_size, float8_source)
    passes = max(flops / vector_rate, bytes_moved / hardware.memory_bandwidth)
    return passes + cost.float8_matmuls * FLOAT8_EXTRA_KERNELS * hardware.op_overhead_seconds


def roofline_record(
    cost: LayerCost,
    seconds: dict[str, float | None],
    batch_size: int,
    source: str,
    float8_source: str = BFLOAT16,
) -> LayerCostRecord:
    """Returns one layer's `LayerCostRecord`: `seconds` and the counts behind them at `batch_size`."""
    return LayerCostRecord(
        path=cost.path,
        class_name=cost.class_name,
        seconds=seconds,
        forward_flops=cost.forward_flops * batch_size,
        backward_flops=cost.backward_flops * batch_size,
        bytes_moved={
            dtype: cost.bytes_moved(dtype, batch_size, float8_source) for dtype in seconds
        },
        saved_elements_per_sample=cost.saved_elements,
        weight_elements=cost.weight_elements,
        source=source,
        note=cost.note,
    )


def predict_costs(
    model: keras.Model,
    hardware: HardwareProfile | str = "local",
    *,
    batch_size: int = 32,
    x: Any = None,
    dtypes: Sequence[str] = PLAN_DTYPES,
    float8_source: str = BFLOAT16,
) -> CostTable:
    """Predicts every layer's forward+backward seconds per dtype with a roofline model.

    Args:
        model: a built Keras model.
        hardware: `"local"`, a profile name such as `"rtx4090"` or a `HardwareProfile`.
        batch_size: samples per training step.
        x: a batch whose shapes are traced (subclassed models, dynamic dimensions).
        dtypes: dtypes to predict.
        float8_source: the dtype of float8 layers' non-matmul work (a plan's `float8_source`).

    Returns:
        A `CostTable` with `source="predicted"`; float8 entries only for `Dense` and `EinsumDense`
        layers on a device with FP8 tensor cores.

    Example:

    ```python
    table = autoprec.cost.predict_costs(model, "rtx2080ti", batch_size=64)
    table.seconds("dense", "bfloat16")  # slower than float16: no bf16 tensor cores
    table = autoprec.cost.predict_costs(model, "rtx4090", dtypes=["float32", "float8"])
    table.layer_seconds("dense", "float8")
    ```
    """
    profile = resolve_hardware(hardware)
    trace = trace_model(model, None if x is None else input_part(x))
    dtypes = [canonical_dtype(dtype) for dtype in dtypes]
    source = canonical_float8_source(float8_source)
    layers = {}
    for path, cost in count_costs(model, trace).items():
        seconds = {d: predicted_layer_seconds(cost, profile, d, batch_size, source) for d in dtypes}
        if seconds.get(FLOAT8, 0.0) is None:
            del seconds[FLOAT8]  # float8 only where it has a prediction
        layers[path] = roofline_record(cost, seconds, batch_size, "predicted", source)
    return CostTable(
        device=profile.display_name,
        source="predicted",
        batch_size=int(batch_size),
        layers=layers,
        edges=[dataclasses.astuple(edge) for edge in trace.edges],
        cast_seconds={
            dtype: {
                "fixed": profile.op_overhead_seconds,
                "per_element": (4 + size) / profile.memory_bandwidth,
            }
            for dtype, size in ITEMSIZE.items()
            if dtype != FLOAT32
        },
        layer_fixed_seconds=profile.op_overhead_seconds,
        memory_bytes=profile.memory_bytes,
        model_fingerprint=model_fingerprint(model),
        versions=framework_versions(),
        stats={"predicted": len(layers)},
    )
