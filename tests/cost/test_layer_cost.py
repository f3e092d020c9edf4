"""Tests for autoprec.cost.layer_cost: the LayerCost value, its totals and the bytes it moves."""

from __future__ import annotations

import pytest

from autoprec.cost import LayerCost
from autoprec.cost import layer_cost as module


def test_totals_and_free_layers():
    counted = LayerCost(
        "dense", "Dense", matmul_flops=6.0, vector_flops=1.0, backward_matmul_flops=12.0
    )
    assert (counted.forward_flops, counted.backward_flops) == (7.0, 12.0)
    assert not counted.is_free and not counted.has_float8_path
    assert LayerCost("flatten", "Flatten").is_free
    assert LayerCost("dense", "Dense", float8_matmuls=1).has_float8_path


def test_bytes_moved_in_each_16_and_32_bit_dtype():
    counted = LayerCost("dense", "Dense", activation_elements=10.0, weight_elements=100)
    # Activations 3x in the dtype; float32 master weights read, (cast, read again), updated.
    assert counted.bytes_moved("float32", 2) == 3 * 10 * 2 * 4 + 100 * (4 + 4 + 4)
    assert counted.bytes_moved("bfloat16", 2) == 3 * 10 * 2 * 2 + 100 * (4 + 2 + 4 + 4)
    assert counted.bytes_moved("float16", 2) == counted.bytes_moved("bfloat16", 2)


def test_float8_bytes_add_the_quantize_passes_and_amax_histories():
    counted = LayerCost(
        "dense",
        "Dense",
        activation_elements=10.0,
        weight_elements=100,
        float8_matmuls=1,
        float8_quantized_elements=5.0,
        float8_kernel_elements=100,
    )
    assert counted.float8_quantized_values(2) == 5 * 2 + 100
    per_value = 2 * module.ITEMSIZE["bfloat16"] + module.FLOAT8_ITEMSIZE
    histories = module.FLOAT8_QUANTIZED_TENSORS * module.FLOAT8_AMAX_HISTORY * 4 * 3
    assert counted.float8_quantize_bytes(2) == pytest.approx(110 * per_value + histories)
    assert counted.bytes_moved("float8", 2) == pytest.approx(
        counted.bytes_moved("bfloat16", 2) + counted.float8_quantize_bytes(2)
    )
    assert LayerCost("relu", "ReLU").float8_quantize_bytes(2) == 0
    assert module.FLOAT8_EXTRA_KERNELS == 3 * module.FLOAT8_QUANTIZED_TENSORS


def test_to_dict_writes_dimension_tuples_as_lists():
    data = LayerCost("dense", "Dense", matmul_dims=(8, 16), float8_dims=(8, 16)).to_dict()
    assert data["matmul_dims"] == [8, 16] and data["float8_dims"] == [8, 16]
    assert data["path"] == "dense" and data["class_name"] == "Dense"
