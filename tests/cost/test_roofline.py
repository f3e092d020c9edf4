"""Tests for autoprec.cost.roofline: predicted seconds per dtype on hardware profiles."""

from __future__ import annotations

import keras

from autoprec import cost, hardware


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
