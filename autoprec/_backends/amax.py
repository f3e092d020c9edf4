"""Bit-pattern amax maths of the guard telemetry, written once with `keras.ops`.

A maximum of `|x|` is an integer maximum of the bit pattern with the sign bit
masked (16-bit tensors reduced as 16-bit integers, no float32 copy).
Non-negative floats order as their bit patterns do, and inf and NaN have the
all-ones exponent, so the result is the amax and the finiteness flag at once
(NaN above inf), under XLA too, whose float maximum drops NaN. An amax is
carried as the int32 bits of a non-negative float32. The one backend-specific
step, reading a tensor's bits as another dtype, is the active backend's own
`bitcast` (chosen by `autoprec._backends.telemetry_backend`).
"""

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
    """Returns whether `value` is a tensor (of any backend) with a floating-point dtype.

    Args:
        value: anything found in a layer's arguments or outputs.

    Returns:
        `True` for a float tensor; `False` for other tensors and non-tensors.

    Example:

    ```python
    is_float_tensor(keras.ops.ones((2,)))  # True
    ```
    """
    dtype = getattr(value, "dtype", None)
    if dtype is None or not hasattr(value, "shape"):
        return False
    try:
        return keras.backend.is_float_dtype(keras.backend.standardize_dtype(dtype))
    except (TypeError, ValueError):
        return False


def amax_bits(tensor: Any, integer: bool = True) -> Any:
    """Returns the float32 bit pattern (int32) of `tensor`'s largest magnitude, NaN and inf kept.

    With `integer`, the sign bit of each value's bit pattern is masked and the
    patterns reduced with an integer maximum, in the tensor's own width (16
    bits for float16 and bfloat16): no float32 copy, and inf or NaN come out
    as inf or NaN (NaN above inf), whatever the reduction does with float NaN.
    Without it, `max(abs(x))` in the tensor's dtype (for devices without fast
    integer reductions).

    Args:
        tensor: a float tensor (or `IndexedSlices`).
        integer: whether to reduce the bit patterns as integers.

    Returns:
        An int32 scalar: the bits of the amax as float32 (0 for an empty tensor).

    Example:

    ```python
    bits = amax_bits(keras.ops.convert_to_tensor([1.0, -3.0], "float16"))
    bits_to_float(bits)  # 3.0
    ```
    """
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
    """Returns `tensor`'s bits read as `dtype` of the same width, on the active backend.

    The backend's own bitcast (`tf.bitcast`, `jax.lax.bitcast_convert_type`), which
    takes scalars on every Keras version the package supports (`keras.ops.view`
    is missing before Keras 3.12 and fails on scalars in 3.12).

    Args:
        tensor: a tensor.
        dtype: a dtype of the same item size, e.g. `"int16"` for float16.

    Returns:
        The tensor of `dtype`, same shape.

    Example:

    ```python
    bit_view(keras.ops.convert_to_tensor(1.0, "float32"), "int32")  # 1065353216
    ```
    """
    return telemetry_backend().bitcast(tensor, dtype)


def bits_to_float(bits: Any) -> Any:
    """Returns the float32 value of an int32 bit pattern from `amax_bits`.

    Args:
        bits: an int32 tensor of float32 bit patterns.

    Returns:
        The float32 tensor those bits spell, same shape.

    Example:

    ```python
    bits_to_float(amax_bits(keras.ops.convert_to_tensor([-2.0])))  # 2.0
    ```
    """
    return bit_view(bits, FLOAT32)
