"""Tests for autoprec.cost.roofline: predicted seconds per dtype on hardware profiles."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from autoprec import cost, hardware
from autoprec.errors import PlanError


def _wide_mlp() -> keras.Model:
    inputs = keras.Input((512,))
    hidden = keras.layers.Dense(1024, activation="relu")(inputs)
    hidden = keras.layers.Dense(1024, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(16)(hidden))


def test_rtx2080ti_never_makes_bfloat16_fast():
    model = _wide_mlp()
    table = cost.predict_costs(model, hardware.get("rtx2080ti"), batch_size=256)
    for path, record in table.layers.items():
        if record.seconds["float32"]:
            assert record.seconds["bfloat16"] > record.seconds["float16"], path
    bf16 = cost.estimate(model, "bfloat16", costs=table)
    fp16 = cost.estimate(model, "float16", costs=table)
    assert bf16.speedup < 1.0 < fp16.speedup
    ampere = cost.estimate(model, "bfloat16", "rtx3090", batch_size=256)
    assert ampere.speedup > 1.0


def test_unaligned_dimensions_lose_the_tensor_core_rate():
    def fp16_over_fp32(units):
        inputs = keras.Input((1024,))
        model = keras.Model(inputs, keras.layers.Dense(units)(inputs))
        record = cost.predict_costs(model, "rtx4090", batch_size=8192).layers["dense"]
        return record.seconds["float16"] / record.seconds["float32"]

    assert fp16_over_fp32(1024) < 0.6
    assert fp16_over_fp32(1020) > 0.8


def test_prediction_takes_dynamic_shapes_from_a_nested_batch(nested_model, nested_batch):
    x, y = nested_batch
    length = x["text"]["tokens"].shape[1]
    with pytest.raises(PlanError, match="pass a batch of inputs"):
        cost.predict_costs(nested_model, "rtx4090", batch_size=8)
    table = cost.predict_costs(nested_model, "rtx4090", batch_size=8, x=(x, y))
    assert table.source == "predicted" and table.stats["predicted"] == len(table.layers)
    projection = table.layers["pair_sum/projection"]
    assert projection.forward_flops == 8 * length * (2 * 4 * 6 + 6)  # (4 -> 6) matmul + bias
    doubled = {"text": {key: np.concatenate([v, v], 1) for key, v in x["text"].items()}}
    doubled["extra"] = x["extra"]
    longer = cost.predict_costs(nested_model, "rtx4090", batch_size=8, x=doubled)
    assert longer.layers["pair_sum/projection"].forward_flops == 2 * projection.forward_flops
