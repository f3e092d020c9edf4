"""The `LayerCost` value: one layer's per-sample FLOPs and elements, and the bytes they move."""

from __future__ import annotations

import dataclasses
from typing import Any

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT32

#: Bytes per element of each compute dtype.
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
#: Bytes per element of a float8 tensor (E4M3 or E5M2).
FLOAT8_ITEMSIZE = 1
#: Tensors a float8 matrix product quantizes each step: its inputs, its kernel (E4M3) and
#: its output gradients (E5M2), each with its own scale and amax history (Keras'
#: `Dense._float8_call`).
FLOAT8_QUANTIZED_TENSORS = 3
#: Kernel launches a float8 matrix product adds per step beyond its 16-bit version: for each
#: of its three quantized tensors, one quantize pass (read in the source dtype, scale,
#: clip, write 8 bits), one amax reduction over the tensor and one update of its amax
#: history and scale, each a kernel of its own (Keras' `quantize_and_dequantize`,
#: `compute_float8_amax_history`, `compute_float8_scale`: 3 x 3 = 9; compilers that fuse
#: the amax into the quantize pass launch about 6).
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
        weight_bytes = self.weight_elements * (4 + itemsize + weight_cast + 4)
        return activation_bytes + weight_bytes

    def float8_quantized_values(self, batch_size: int) -> float:
        """Returns the values the float8 path quantizes in one step of `batch_size` samples."""
        return self.float8_quantized_elements * batch_size + self.float8_kernel_elements

    def float8_quantize_bytes(self, batch_size: int, float8_source: str = BFLOAT16) -> float:
        """Returns the bytes the float8 path's quantize work moves in one step."""
        per_value = 2 * ITEMSIZE[float8_source] + FLOAT8_ITEMSIZE
        histories = self.float8_matmuls * FLOAT8_QUANTIZED_TENSORS * FLOAT8_AMAX_HISTORY * 4 * 3
        return self.float8_quantized_values(batch_size) * per_value + histories

    def to_dict(self) -> dict[str, Any]:
        """Returns the fields as a JSON-ready dict, its dimension tuples as lists."""
        data = dataclasses.asdict(self)
        data["matmul_dims"] = list(self.matmul_dims)
        data["float8_dims"] = list(self.float8_dims)
        return data
