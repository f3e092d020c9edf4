"""Tests of float8 in the cost model: counts, roofline predictions, cost tables, estimates, timing."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

import autoprec
from autoprec import cost, hardware
from autoprec._core.dtypes import PLAN_DTYPES
from autoprec.cost.measure import float8_timeable
from autoprec.cost.prediction import (
    FLOAT8_EXTRA_KERNELS,
    MATMUL_EFFICIENCY,
    float8_quantize_seconds,
)
from autoprec.cost.steps import rebuild_layer, time_layer
from autoprec.layers import layer_paths

RTX4090 = hardware.get("rtx4090")


def _dense_cost(features: int, units: int) -> cost.LayerCost:
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(units, name="dense")])
    return cost.count_costs(model)["dense"]


def _seconds(layer_cost: cost.LayerCost, dtype: str, batch_size: int) -> float:
    return cost.predicted_layer_seconds(layer_cost, RTX4090, dtype, batch_size)


def test_a_wide_dense_is_predicted_faster_in_float8_close_to_2x_on_its_matmuls():
    wide = _dense_cost(4096, 4096)
    bfloat16, float8 = _seconds(wide, "bfloat16", 8192), _seconds(wide, "float8", 8192)
    assert 1.6 < bfloat16 / float8 < 2.0
    assert RTX4090.peak_flops("float8") == 2 * RTX4090.peak_flops("bfloat16")
    matmul_flops = (wide.matmul_flops + wide.backward_matmul_flops) * 8192
    matmul_seconds = matmul_flops / (RTX4090.peak_flops("float8") * MATMUL_EFFICIENCY)
    quantize = float8_quantize_seconds(wide, RTX4090, 8192)
    # The rest of the float8 time is the quantize work, which the matmuls do not hide.
    assert float8 == pytest.approx(
        matmul_seconds + quantize + wide.kernels * RTX4090.op_overhead_seconds, rel=0.01
    )


def test_a_narrow_dense_is_predicted_slower_in_float8_launches_dominate():
    narrow = _dense_cost(64, 64)
    bfloat16, float8 = _seconds(narrow, "bfloat16", 32), _seconds(narrow, "float8", 32)
    assert float8 > bfloat16
    extra_launches = FLOAT8_EXTRA_KERNELS * RTX4090.op_overhead_seconds
    assert float8 - bfloat16 >= extra_launches
    assert FLOAT8_EXTRA_KERNELS == 9


def test_a_dense_whose_dimension_is_no_multiple_of_16_gets_no_fp8_matmul():
    misaligned = _dense_cost(4096, 4104)  # 4104 = 8 x 513: aligned for 16-bit, not for FP8
    assert misaligned.float8_dims == (4096, 4104)
    assert _seconds(misaligned, "float8", 8192) > _seconds(misaligned, "bfloat16", 8192)


def test_float8_needs_fp8_tensor_cores_and_a_float8_path():
    wide = _dense_cost(256, 256)
    for name in ("rtx3090", "rtx2080ti", "cpu-amx", "cpu-generic"):
        assert cost.predicted_layer_seconds(wide, hardware.get(name), "float8", 64) is None
    conv = keras.Sequential([keras.Input((8, 8, 16)), keras.layers.Conv2D(16, 3, name="conv")])
    conv_cost = cost.count_costs(conv)["conv"]
    assert not conv_cost.has_float8_path
    assert cost.predicted_layer_seconds(conv_cost, RTX4090, "float8", 64) is None


def test_a_float32_source_costs_more_than_bfloat16():
    wide = _dense_cost(1024, 1024)
    from_bfloat16 = cost.predicted_layer_seconds(wide, RTX4090, "float8", 1024, "bfloat16")
    from_float32 = cost.predicted_layer_seconds(wide, RTX4090, "float8", 1024, "float32")
    assert from_float32 > from_bfloat16


def _transformer_block(sequence: int = 32, width: int = 64, classes: int = 10) -> keras.Model:
    inputs = keras.Input((sequence, width))
    attended = keras.layers.MultiHeadAttention(num_heads=4, key_dim=16, name="attention")(
        inputs, inputs
    )
    hidden = keras.layers.LayerNormalization(name="norm_1")(
        keras.layers.Add(name="add_1")([inputs, attended])
    )
    wide = keras.layers.Dense(4 * width, activation="gelu", name="ffn_in")(hidden)
    narrow = keras.layers.Dense(width, name="ffn_out")(wide)
    hidden = keras.layers.LayerNormalization(name="norm_2")(
        keras.layers.Add(name="add_2")([hidden, narrow])
    )
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(hidden)
    outputs = keras.layers.Dense(classes, name="head")(pooled)
    model = keras.Model(inputs, outputs, name="block")
    model.compile(optimizer="adam", loss="mse")
    return model


def _float8_paths(model: keras.Model) -> set[str]:
    return {
        path
        for path, layer in layer_paths(model).items()
        if type(layer).__name__ in ("Dense", "EinsumDense")
    }


def test_einsum_dense_counts_its_gemm_dimensions():
    counts = cost.count_costs(_transformer_block())
    query = counts["attention/query_dense"]
    assert query.float8_dims == (64, 64)  # kernel (64, 4, 16): 64 contracted, 4 x 16 out
    assert counts["attention/output_dense"].float8_dims == (64, 64)
    assert query.float8_quantized_elements == 2 * 32 * 64  # inputs and output gradients
    assert query.float8_kernel_elements == 64 * 64
    assert counts["attention"].float8_matmuls == 0 and counts["norm_1"].float8_dims == ()


def test_cost_tables_hold_float8_only_for_eligible_layers_on_fp8_hardware(tmp_path):
    model = _transformer_block()
    eligible = _float8_paths(model)
    table = cost.predict_costs(model, "rtx4090", batch_size=64, dtypes=PLAN_DTYPES)
    with_float8 = {path for path, record in table.layers.items() if "float8" in record.seconds}
    assert with_float8 == eligible and "attention/key_dense" in eligible
    for path in table.layers:
        seconds = table.layer_seconds(path, "float8")
        assert (seconds is not None) is (path in eligible), path
        assert table.layer_seconds(path, "bfloat16") == table.seconds(path, "bfloat16")
    assert table.layer_seconds("ffn_in", "float8") == table.seconds("ffn_in", "float8")
    assert math.isinf(table.seconds("norm_1", "float8"))
    assert "float8" in table.summary().splitlines()[1]
    loaded = cost.CostTable.load(table.save(tmp_path / "table.json"))
    assert loaded.layer_seconds("ffn_in", "float8") == table.layer_seconds("ffn_in", "float8")
    ampere = cost.predict_costs(model, "rtx3090", batch_size=64, dtypes=PLAN_DTYPES)
    assert not any("float8" in record.seconds for record in ampere.layers.values())
    assert all(ampere.layer_seconds(path, "float8") is None for path in ampere.layers)
    default = cost.predict_costs(model, "rtx4090", batch_size=64)  # float8 where the card has it
    assert {path for path, r in default.layers.items() if "float8" in r.seconds} == eligible


def test_estimate_of_a_float8_plan_works_and_is_reproducible():
    model = _transformer_block()
    plan = autoprec.PrecisionPlan.uniform(model, "float8")
    first = cost.estimate(model, plan, "rtx4090", batch_size=64)
    again = cost.estimate(model, plan, "rtx4090", batch_size=64)
    assert math.isfinite(first.step_seconds) and first.infeasible_layers == ()
    assert first.step_seconds == again.step_seconds and first.layer_seconds == again.layer_seconds
    table = cost.predict_costs(model, "rtx4090", batch_size=64, dtypes=PLAN_DTYPES)
    for path in _float8_paths(model):
        assert first.layer_seconds[path] == pytest.approx(table.layer_seconds(path, "float8"))
    assert first.layer_seconds["norm_1"] == pytest.approx(table.layer_seconds("norm_1", "bfloat16"))
    # A uniform float8 plan passes every tensor in bfloat16: no casts between its layers.
    bfloat16 = cost.estimate(model, "bfloat16", "rtx4090", batch_size=64)
    assert first.cast_seconds == pytest.approx(bfloat16.cast_seconds)
    # This block is small: the quantize work outweighs what its matmuls gain.
    assert first.step_seconds > bfloat16.step_seconds
    assert cost.estimate(model, "float8", "rtx4090", batch_size=64).step_seconds == pytest.approx(
        first.step_seconds
    )


def test_estimate_of_a_float8_plan_on_hardware_without_fp8_names_the_float8_layers():
    model = _transformer_block()
    plan = autoprec.PrecisionPlan.uniform(model, "float8")
    ampere = cost.estimate(model, plan, "rtx3090", batch_size=64)
    assert set(ampere.infeasible_layers) == _float8_paths(model)
    assert math.isinf(ampere.step_seconds)


def test_a_wide_float8_layer_speeds_up_a_plan_a_narrow_one_slows_it():
    inputs = keras.Input((4096,))
    hidden = keras.layers.Dense(4096, name="wide")(inputs)
    outputs = keras.layers.Dense(16, name="narrow")(hidden)
    model = keras.Model(inputs, outputs)
    base = {"wide": "bfloat16", "narrow": "bfloat16"}
    bfloat16 = cost.estimate(model, base, "rtx4090", batch_size=8192)
    wide = cost.estimate(model, {**base, "wide": "float8"}, "rtx4090", batch_size=8192)
    narrow = cost.estimate(model, {**base, "narrow": "float8"}, "rtx4090", batch_size=8192)
    assert wide.step_seconds < 0.7 * bfloat16.step_seconds
    assert narrow.step_seconds > bfloat16.step_seconds
    assert wide.parameter_bytes > bfloat16.parameter_bytes  # the 8-bit kernel copy


def test_calibrate_never_times_float8_on_a_cpu():
    assert not float8_timeable(hardware.get("cpu-amx"))
    # The profile claims FP8, the local device (a CPU here) has none.
    if hardware.detect().kind == "cpu":
        assert not float8_timeable(RTX4090)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(16, name="dense")])
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((8, 16), "float32")
    table = cost.calibrate(
        model,
        (x, x),
        dtypes=["float32", "float8"],
        hardware="cpu-generic",
        repeats=3,
        measure_model_step=["float32", "float8"],
        use_cache=False,
        verbose=0,
        measure_mixed_steps=False,
    )
    assert table.layer_seconds("dense", "float32") is not None
    assert table.layer_seconds("dense", "float8") is None
    assert set(table.measured_step_seconds_by_dtype) == {"float32"}


def test_a_float8_copy_of_a_dense_has_its_scales_and_can_be_timed():
    layer = keras.layers.Dense(16, name="projection")
    model = keras.Sequential([keras.Input((16,)), layer])
    copy = rebuild_layer(layer, "float8")
    assert copy.dtype_policy.name == "float8_from_mixed_bfloat16"
    copy.build((None, 16))
    assert any("amax_history" in variable.path for variable in copy.trainable_variables)
    call = cost.trace_model(model).calls["projection"][0]
    assert time_layer(layer, call, "float8", 8, 1, False) > 0
