"""Tests for autoprec._backends.instrument: the guard telemetry's bit-pattern amax, on real tensors."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from autoprec import numerics
from autoprec._backends.instrument import (
    FLOAT32_INFINITY_BITS,
    amax_bits,
    bit_view,
    bits_to_float,
    is_float_tensor,
)


@pytest.mark.parametrize("integer", [True, False])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_amax_bits_keeps_the_largest_magnitude_and_non_finite_values(dtype, integer):
    def amax(values, bits=None):
        if bits is None:
            tensor = keras.ops.cast(keras.ops.convert_to_tensor(values, "float32"), dtype)
        else:  # a given bit pattern, e.g. a NaN with its sign bit set
            tensor = keras.ops.view(keras.ops.convert_to_tensor(bits), dtype)
        return float(keras.ops.convert_to_numpy(bits_to_float(amax_bits(tensor, integer))))

    largest = numerics.float_format(dtype).max
    assert amax([[1.0, -3.0], [2.0, 0.5]]) == 3.0
    assert amax([-largest, 1.0]) == pytest.approx(largest, rel=1e-6)
    assert amax([-0.0, 0.0]) == 0.0
    assert amax([1.0, -np.inf, 2.0]) == np.inf
    assert np.isnan(amax([1.0, np.nan, np.inf]))
    if dtype == "float16":
        assert amax([6e-8, -1e-7]) == pytest.approx(1.1920929e-07)  # subnormals
    if integer:  # a NaN whose sign bit is set (0 * inf on x86) is still seen
        negative_nan = {"float16": [0xFE00, 0x3C00], "bfloat16": [0xFFC0, 0x3F80]}
        bits = negative_nan.get(dtype, [])
        if bits:
            assert np.isnan(amax(None, np.array(bits, np.uint16).view(np.int16)))


def test_an_empty_tensor_has_amax_zero():
    empty = keras.ops.zeros((0, 4), "float16")
    assert int(keras.ops.convert_to_numpy(amax_bits(empty))) == 0


def test_bit_view_reads_scalars_with_the_backends_bitcast():
    one = keras.ops.convert_to_tensor(1.0, "float32")
    assert int(keras.ops.convert_to_numpy(bit_view(one, "int32"))) == 0x3F800000
    infinity = keras.ops.convert_to_tensor(FLOAT32_INFINITY_BITS, "int32")
    assert float(keras.ops.convert_to_numpy(bits_to_float(infinity))) == np.inf


def test_is_float_tensor_takes_only_float_tensors():
    assert is_float_tensor(keras.ops.ones((2,), "bfloat16"))
    assert not is_float_tensor(keras.ops.ones((2,), "int32"))
    assert not is_float_tensor(np.float32(1.0).item())
    assert not is_float_tensor("float32")
