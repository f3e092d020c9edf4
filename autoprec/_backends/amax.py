"""Bit-pattern amax maths of the guard telemetry, written once with `keras.ops`."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from .._core.dtypes import BFLOAT16, FLOAT16, FLOAT32
from . import telemetry_backend

#: Float32 inf as int32 bits; NaN patterns lie above it, every finite amax below.
FLOAT32_INFINITY_BITS = 0x7F800000
# The magnitude (sign bit masked) of each float dtype's bit pattern, and its integer dtype.
_MAGNITUDE_BITS = {FLOAT16: 0x7FFF, BFLOAT16: 0x7FFF, FLOAT32: 0x7FFFFFFF}
_BITS_DTYPE = {FLOAT16: "int16", BFLOAT16: "int16", FLOAT32: "int32"}


def is_float_tensor(value: object) -> bool:
    """Returns whether `value` is a tensor (of any backend) with a floating-point dtype."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or not hasattr(value, "shape"):
        return False
    try:
        return keras.backend.is_float_dtype(keras.backend.standardize_dtype(dtype))
    except (TypeError, ValueError):
        return False


def amax_bits(tensor: Any, integer: bool = True) -> Any:
    """Returns the float32 bit pattern (int32) of `tensor`'s largest magnitude, NaN and inf kept."""
    if hasattr(tensor, "indices") and hasattr(tensor, "values"):  # IndexedSlices
        tensor = tensor.values
    if any(dim == 0 for dim in tensor.shape):
        return ops.convert_to_tensor(0, "int32")
    dtype = keras.backend.standardize_dtype(tensor.dtype)
    if not integer:
        largest = ops.cast(ops.max(ops.abs(tensor)), FLOAT32)
        return bit_view(largest, "int32")
    if dtype not in _BITS_DTYPE:
        tensor, dtype = ops.cast(tensor, FLOAT32), FLOAT32
    bits_dtype = _BITS_DTYPE[dtype]
    mask = ops.convert_to_tensor(_MAGNITUDE_BITS[dtype], bits_dtype)
    largest = ops.max(ops.bitwise_and(bit_view(tensor, bits_dtype), mask))
    if dtype == BFLOAT16:  # the upper half of a float32
        return ops.left_shift(ops.cast(largest, "int32"), ops.convert_to_tensor(16, "int32"))
    if dtype == FLOAT16:
        return bit_view(ops.cast(bit_view(largest, FLOAT16), FLOAT32), "int32")
    return largest


def bit_view(tensor: Any, dtype: str) -> Any:
    """Returns `tensor`'s bits read as `dtype` of the same width, on the active backend."""
    return telemetry_backend().bitcast(tensor, dtype)


def bits_to_float(bits: Any) -> Any:
    """Returns the float32 value of an int32 bit pattern from `amax_bits`."""
    return bit_view(bits, FLOAT32)
