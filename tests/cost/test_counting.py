"""Tests for autoprec.cost.counting: one LayerCost per layer, every call of a shared layer summed."""

from __future__ import annotations

import keras
import pytest

from autoprec import cost
from autoprec.layers import layer_paths


def test_count_costs_has_every_layer_in_traversal_order(mlp):
    counts = cost.count_costs(mlp)
    assert list(counts) == list(layer_paths(mlp))
    assert all(isinstance(counted, cost.LayerCost) for counted in counts.values())
    assert counts == cost.count_costs(mlp, cost.trace_model(mlp))


def test_a_shared_layer_counts_every_call():
    shared = keras.layers.Dense(4, use_bias=False, name="shared")
    left, right = keras.Input((8,)), keras.Input((8,))
    model = keras.Model([left, right], [shared(left), shared(right)])
    counted = cost.count_costs(model)["shared"]
    assert counted.matmul_flops == pytest.approx(2 * (2 * 8 * 4))
    assert counted.matmul_dims == (8, 4, 8, 4)
    assert counted.float8_matmuls == 2
    assert counted.weight_elements == 8 * 4  # the same weights, not counted twice


def test_a_recurrent_layer_counts_the_recurrence_and_its_cell_nothing():
    model = keras.Sequential([keras.Input((5, 3)), keras.layers.LSTM(4)])
    counts = cost.count_costs(model)
    assert counts["lstm"].matmul_flops == pytest.approx(1120)
    assert counts["lstm/cell"].forward_flops == 0
    assert counts["lstm/cell"].note == "counted in its recurrent layer"
