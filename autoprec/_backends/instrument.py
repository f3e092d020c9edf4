"""What both backends' in-step instrumentation shares: the types of its interface, the bit-pattern
amax maths and the guard's history update, written once with `keras.ops` (or NumPy on the host)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias

import keras
import numpy as np
from keras import ops

from .._core.dtypes import BFLOAT16, FLOAT16, FLOAT32

#: Float32 inf as int32 bits; NaN patterns lie above it, every finite amax below.
FLOAT32_INFINITY_BITS = 0x7F800000
# The magnitude (sign bit masked) of each float dtype's bit pattern, and its integer dtype.
_MAGNITUDE_BITS = {FLOAT16: 0x7FFF, BFLOAT16: 0x7FFF, FLOAT32: 0x7FFFFFFF}
_BITS_DTYPE = {FLOAT16: "int16", BFLOAT16: "int16", FLOAT32: "int32"}

#: One recorded tensor: `(layer path, kind, key)`, e.g. `("dense", "activations", "output")`.
Slot: TypeAlias = tuple[str, str, str]
#: How the hooks replace a method for as long as they are installed: `replace(owner, name, value)`.
Replace = Callable[[object, str, object], None]
#: `{id(variable): (layer path, weight name)}` of the model's trainable weights.
WeightOwners = Mapping[int, tuple[str, str]]
#: What `write_histograms` writes: `(tag, exponents, counts)` triples, bucket `i`
#: spanning `[exponents[i], exponents[i] + 1)`.
HistogramSeries = Iterable[tuple[str, np.ndarray, np.ndarray]]


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
    if keras.backend.backend() == "jax":
        import jax
        import jax.numpy as jnp

        return jax.lax.bitcast_convert_type(jnp.asarray(tensor), jnp.dtype(dtype))
    import tensorflow as tf

    return tf.bitcast(tf.convert_to_tensor(tensor), tf.as_dtype(dtype))


def bits_to_float(bits: Any) -> Any:
    """Returns the float32 value of an int32 bit pattern from `amax_bits`."""
    return bit_view(bits, FLOAT32)


#: Length of the status: `[failed, near_range]`.
STATUS_SLOTS = 2


def cleared_status() -> np.ndarray:
    """Returns the status with no flag raised."""
    return np.zeros(STATUS_SLOTS, np.int32)


def advance_history(
    recorder: Any, frame: Any, history: Any, status: Any, xp: Any
) -> tuple[Any, Any]:
    """Returns the history with `frame` appended and the status raised by `frame`'s flags."""
    failed, near = recorder.status_flags(frame, history, xp)
    history = xp.concatenate([history[1:], frame[None]], axis=0)
    return history, xp.maximum(status, xp.stack([failed, near]))
