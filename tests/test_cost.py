"""Tests for autoprec.cost: FLOP counts, predictions, calibration cache, estimates."""

from __future__ import annotations

import json
import math

import keras
import numpy as np
import pytest
from conftest import build_attention_model, build_mlp

from autoprec import PrecisionPlan, cost, hardware
from autoprec.errors import BackendError, HardwareError, PlanError
from autoprec.layers import layer_paths

GIB = 1024**3


def _single_layer_cost(input_shape, layer, input_dtype="float32") -> cost.LayerCost:
    inputs = keras.Input(input_shape, dtype=input_dtype)
    model = keras.Model(inputs, layer(inputs))
    paths = layer_paths(model)
    path = next(path for path, candidate in paths.items() if candidate is layer)
    return cost.count_costs(model)[path]


# Hand-computed per-sample counts: 2 FLOPs per multiply-add.
@pytest.mark.parametrize(
    "input_shape, make_layer, matmul, vector",
    [
        # 8 -> 16: 2*8*16 matmul; bias 16 + relu 16.
        ((8,), lambda: keras.layers.Dense(16, activation="relu"), 256, 32),
        # rows 5: 2*5*8*16; bias 80.
        ((5, 8), lambda: keras.layers.Dense(16), 1280, 80),
        ((8,), lambda: keras.layers.EinsumDense("ab,bc->ac", output_shape=16), 256, 0),
        # abc,cde->abde with b=5, c=8, d=2, e=4: 2*5*8*2*4.
        (
            (5, 8),
            lambda: keras.layers.EinsumDense("abc,cde->abde", output_shape=(None, 2, 4)),
            640,
            0,
        ),
        # 10x10 outputs x 4 filters x 3x3x1 window: 2*100*4*9; bias+relu on 400.
        ((12, 12, 1), lambda: keras.layers.Conv2D(4, 3, activation="relu"), 7200, 800),
        # groups=2: each filter sees 1 of 2 channels.
        ((12, 12, 2), lambda: keras.layers.Conv2D(4, 3, groups=2, use_bias=False), 7200, 0),
        # 8 positions x 6 filters x 3 x 4 channels.
        ((10, 4), lambda: keras.layers.Conv1D(6, 3, use_bias=False), 1152, 0),
        # 27 positions x 2 filters x 8 window x 1 channel.
        ((4, 4, 4, 1), lambda: keras.layers.Conv3D(2, 2, use_bias=False), 864, 0),
        # 16 input positions x 2 channels x 2x2 window x 3 filters.
        (
            (4, 4, 2),
            lambda: keras.layers.Conv2DTranspose(3, 2, strides=2, use_bias=False),
            768,
            0,
        ),
        # depthwise: 4x4x4 outputs x 3x3 window, vector work.
        ((6, 6, 4), lambda: keras.layers.DepthwiseConv2D(3, use_bias=False), 0, 1152),
        # 8 positions x 4 channels x window 3.
        ((10, 4), lambda: keras.layers.DepthwiseConv1D(3, use_bias=False), 0, 192),
        # separable: depthwise 2*16*4*9 (vector) + pointwise 2*16*4*5 (matmul).
        ((6, 6, 4), lambda: keras.layers.SeparableConv2D(5, 3, use_bias=False), 640, 1152),
        # LSTM: 5 steps x 2*(3+4)*4*4; GRU 3 gates; SimpleRNN 1.
        ((5, 3), lambda: keras.layers.LSTM(4), 1120, 5 * 4 * 10),
        ((5, 3), lambda: keras.layers.GRU(4), 840, 5 * 4 * 9),
        ((5, 3), lambda: keras.layers.SimpleRNN(4), 280, 5 * 4 * 2),
        # normalisation: 8 FLOPs per element.
        ((6, 6, 4), lambda: keras.layers.BatchNormalization(), 0, 8 * 144),
        ((5, 8), lambda: keras.layers.LayerNormalization(), 0, 8 * 40),
        ((6, 6, 4), lambda: keras.layers.GroupNormalization(groups=2), 0, 8 * 144),
        # pooling: 5x5x4 outputs x 2x2 window; global: every input element.
        ((10, 10, 4), lambda: keras.layers.MaxPooling2D(2), 0, 400),
        ((10, 10, 4), lambda: keras.layers.AveragePooling2D(2), 0, 400),
        ((10, 10, 4), lambda: keras.layers.GlobalAveragePooling2D(), 0, 400),
        ((16,), lambda: keras.layers.Activation("tanh"), 0, 64),
        ((16,), lambda: keras.layers.Dropout(0.5), 0, 32),
        ((16,), lambda: keras.layers.Flatten(), 0, 0),
    ],
)
def test_forward_flops_match_hand_counts(input_shape, make_layer, matmul, vector):
    counted = _single_layer_cost(input_shape, make_layer())
    assert counted.matmul_flops == pytest.approx(matmul)
    assert counted.vector_flops == pytest.approx(vector)
    assert counted.backward_matmul_flops == pytest.approx(2 * matmul)


def test_flatten_is_free_and_dense_counts_weights():
    assert _single_layer_cost((4, 4), keras.layers.Flatten()).is_free
    dense = _single_layer_cost((8,), keras.layers.Dense(16))
    assert dense.weight_elements == 8 * 16 + 16
    assert dense.matmul_dims == (8, 16)


def test_merge_layers_count_one_flop_per_extra_input():
    inputs = [keras.Input((8,)) for _ in range(3)]
    added = keras.layers.Add()(inputs[:2])
    multiplied = keras.layers.Multiply()(inputs)
    model = keras.Model(inputs, [added, multiplied])
    counts = cost.count_costs(model, cost.trace_model(model))
    assert counts["add"].vector_flops == 8
    assert counts["multiply"].vector_flops == 16


def test_embedding_gathers_without_forward_flops():
    counted = _single_layer_cost((6,), keras.layers.Embedding(10, 4), input_dtype="int32")
    assert counted.forward_flops == 0
    assert counted.backward_vector_flops == 24
    assert counted.activation_elements == 24 + 6


def test_attention_counts_inner_einsums_and_projections_separately():
    model = build_attention_model(sequence=8, features=8)
    counts = cost.count_costs(model)
    # q.k and softmax.v: 2 heads x 8 x 8 scores x key_dim 4, twice.
    assert counts["attention"].matmul_flops == pytest.approx(2 * (2 * 2 * 8 * 8 * 4))
    # query projection abc,cde->abde: 8 x 8 x 2 x 4.
    assert counts["attention/query_dense"].matmul_flops == pytest.approx(2 * 8 * 8 * 2 * 4)
    assert counts["attention/softmax"].is_free


def test_trace_records_shapes_edges_and_removes_hooks(mlp):
    sample = np.ones((3, 8), dtype="float32")
    before = mlp.predict(sample, verbose=0)
    trace = cost.trace_model(mlp)
    assert trace.calls["dense"][0].outputs[0].shape == (None, 16)
    assert cost.Edge(None, "dense", 8) in trace.edges
    # Dropout returns its input unchanged at inference: the tensor comes from dense or dropout.
    assert any(
        edge.consumer == "dense_1" and edge.producer in ("dense", "dropout") for edge in trace.edges
    )
    for layer in layer_paths(mlp).values():
        assert "call" not in vars(layer)
    np.testing.assert_allclose(mlp.predict(sample, verbose=0), before)


def _wide_mlp() -> keras.Model:
    inputs = keras.Input((512,))
    hidden = keras.layers.Dense(1024, activation="relu")(inputs)
    hidden = keras.layers.Dense(1024, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(16)(hidden))


def test_predicted_estimate_is_monotone_in_batch_size():
    model = _wide_mlp()
    table = cost.predict_costs(model, "rtx4090", batch_size=64)
    previous = 0.0
    for batch_size in (1, 8, 64, 512, 4096):
        step = cost.estimate(model, "bfloat16", table, batch_size=batch_size).step_seconds
        assert step > previous
        previous = step
        direct = cost.estimate(model, "bfloat16", "rtx4090", batch_size=batch_size)
        assert direct.step_seconds > 0


def test_rtx2080ti_never_makes_bfloat16_fast():
    model = _wide_mlp()
    table = cost.predict_costs(model, hardware.get("rtx2080ti"), batch_size=256)
    for path, record in table.layers.items():
        if record.seconds["float32"]:
            assert record.seconds["bfloat16"] > record.seconds["float16"], path
    bf16 = cost.estimate(model, "bfloat16", table)
    fp16 = cost.estimate(model, "float16", table)
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


def test_dtype_the_device_cannot_run_is_infeasible():
    no_half = hardware.profile_from_dict(
        {
            "name": "fp32-only",
            "kind": "gpu",
            "float32_flops": 1e13,
            "memory_bandwidth": 5e11,
            "memory_bytes": 8 * GIB,
        }
    )
    model = build_mlp()
    est = cost.estimate(model, "float16", no_half, batch_size=32)
    assert math.isinf(est.step_seconds) and est.speedup == 0.0
    assert "dense" in est.infeasible_layers
    assert cost.estimate(model, "float32", no_half, batch_size=32).speedup == pytest.approx(1.0)


def test_max_batch_size_fits_8gb(cnn):
    est = cost.estimate(cnn, "float16", "rtx4060ti-8gb", batch_size=32)
    assert est.memory_bytes == 8 * GIB
    largest = est.max_batch_size()
    usable = 8 * GIB * cost.USABLE_MEMORY_FRACTION
    assert largest > 32
    assert est.fixed_memory_bytes + largest * est.activation_bytes_per_sample <= usable
    assert est.fixed_memory_bytes + (largest + 1) * est.activation_bytes_per_sample > usable
    float32 = cost.estimate(cnn, "float32", "rtx4060ti-8gb", batch_size=32)
    assert float32.activation_bytes_per_sample > est.activation_bytes_per_sample
    assert float32.max_batch_size() < largest
    assert est.max_batch_size(4 * GIB) < largest
    assert est.max_batch_size(1) == 0


class _PlanLike:
    def __init__(self, layers):
        self.layers = layers


def test_estimate_accepts_plans_dicts_and_counts_casts(mlp):
    table = cost.predict_costs(mlp, "rtx4090", batch_size=64)
    uniform = cost.estimate(mlp, {path: "float32" for path in layer_paths(mlp)}, table)
    assert uniform.cast_seconds == 0 and uniform.speedup == pytest.approx(1.0)
    mixed = {"dense": "float16", "dense_1": "float32", "dense_2": "float16"}
    from_object = cost.estimate(mlp, _PlanLike(mixed), table)
    from_dict = cost.estimate(mlp, mixed, table)
    assert from_object.step_seconds == pytest.approx(from_dict.step_seconds)
    assert from_dict.cast_seconds > 0
    with pytest.raises(PlanError):
        cost.estimate(mlp, {"dense": "float8"}, table)
    with pytest.raises(HardwareError):
        cost.estimate(mlp, "float32", "rtx9999")


def test_cost_table_round_trips_through_json(tmp_path, attention_model):
    table = cost.predict_costs(attention_model, "rtx3060", batch_size=16)
    loaded = cost.CostTable.load(table.save(tmp_path / "costs.json"))
    assert loaded.to_dict() == table.to_dict()
    assert "attention" in table.summary()
    (tmp_path / "bad.json").write_text('{"device": "x"}')
    with pytest.raises(PlanError, match="bad.json"):
        cost.CostTable.load(tmp_path / "bad.json")


def test_calibrate_measures_then_reuses_cache_and_invalidates_on_change(tmp_path):
    x = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    y = np.zeros((32,), dtype="int32")
    model = build_mlp()
    first = cost.calibrate(model, (x, y), repeats=2, cache_dir=tmp_path, progress=False)
    assert first.source == "measured" and first.batch_size == 32
    assert first.stats["timed"] > 0 and first.stats["cached"] == 0
    assert first.stats["fallback"] == 0 and first.stats["model_step"] >= 1
    for path in ("dense", "dense_1", "dense_2"):
        assert all(first.layers[path].seconds[dtype] > 0 for dtype in ("float32", "float16"))
    est = cost.estimate(model, "float32", first)
    assert est.float32_step_seconds == pytest.approx(first.measured_step_seconds, rel=1e-6)

    second = cost.calibrate(model, (x, y), repeats=2, cache_dir=tmp_path, progress=False)
    assert second.stats["timed"] == 0 and second.stats["model_steps_timed"] == 0
    assert second.stats["cached"] == first.stats["timed"]
    assert second.layers["dense"].seconds == first.layers["dense"].seconds
    assert second.measured_step_seconds_by_dtype == first.measured_step_seconds_by_dtype

    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    hidden = keras.layers.Dropout(0.1)(hidden)
    hidden = keras.layers.Dense(24, activation="relu")(hidden)
    changed = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))
    third = cost.calibrate(
        changed, (x, y), repeats=2, cache_dir=tmp_path, progress=False, measure_model_step=False
    )
    # dense is unchanged (cached); dense_1 and dense_2 see new shapes (timed again).
    assert third.stats["cached"] == 2 * 3
    assert third.stats["timed"] == 2 * 3


def test_calibrate_attention_model_subtracts_projections(tmp_path, attention_model):
    x = np.random.default_rng(0).normal(size=(16, 8, 8)).astype("float32")
    table = cost.calibrate(
        attention_model,
        x,
        dtypes=("float32", "bfloat16"),
        repeats=2,
        cache_dir=tmp_path,
        progress=False,
        measure_model_step=False,
    )
    assert table.stats["fallback"] == 0
    assert set(table.layers["attention"].seconds) == {"float32", "bfloat16"}
    assert table.layers["attention"].seconds["float32"] > 0
    assert table.cast_seconds["bfloat16"]["per_element"] >= 0


class NeedsArgument(keras.layers.Layer):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def call(self, inputs):
        return inputs * self.scale


def test_layer_that_cannot_be_rebuilt_falls_back_to_prediction(tmp_path):
    inputs = keras.Input((8,))
    outputs = keras.layers.Dense(4)(NeedsArgument(2.0)(inputs))
    model = keras.Model(inputs, outputs)
    table = cost.calibrate(
        model,
        np.ones((8, 8), dtype="float32"),
        dtypes=("float32",),
        repeats=2,
        cache_dir=tmp_path,
        progress=False,
        measure_model_step=False,
    )
    path = next(path for path, layer in layer_paths(model).items() if type(layer) is NeedsArgument)
    custom = table.layers[path]
    assert custom.source.startswith("predicted (fallback")
    assert custom.seconds["float32"] > 0
    assert table.layers["dense"].source == "measured"
    assert table.stats["fallback"] == 1


def test_whole_steps_per_dtype_make_uniform_estimates_exact(tmp_path):
    x = np.random.default_rng(1).normal(size=(16, 8)).astype("float32")
    y = np.zeros((16,), dtype="int32")
    model = build_mlp()
    # On a CPU profile float16 is slow: "fast" times float32 and bfloat16 only.
    fast = cost.calibrate(
        model,
        (x, y),
        repeats=2,
        cache_dir=tmp_path,
        progress=False,
        hardware="cpu-avx512-bf16",
        measure_model_step="fast",
    )
    assert set(fast.measured_step_seconds_by_dtype) == {"float32", "bfloat16"}
    assert fast.time_scale("float16") == fast.layer_time_scale
    # The default adds float16; layers and the two steps above come from the cache.
    table = cost.calibrate(
        model, (x, y), repeats=2, cache_dir=tmp_path, progress=False, hardware="cpu-avx512-bf16"
    )
    assert table.stats["timed"] == 0 and table.stats["model_steps_timed"] == 1
    measured = table.measured_step_seconds_by_dtype
    assert set(measured) == {"float32", "bfloat16", "float16"}
    assert measured["float32"] == table.measured_step_seconds
    loaded = cost.CostTable.from_dict(json.loads(json.dumps(table.to_dict())))
    assert loaded.measured_step_seconds_by_dtype == measured
    assert loaded.layer_time_scale_by_dtype == table.layer_time_scale_by_dtype
    for dtype, seconds in measured.items():
        for costs in (table, loaded):
            plan = PrecisionPlan.uniform(model, dtype)
            assert cost.estimate(model, plan, costs).step_seconds == pytest.approx(
                seconds, rel=1e-6
            )
            assert cost.estimate(model, dtype, costs).step_seconds == pytest.approx(
                seconds, rel=1e-6
            )
    assert f"whole bfloat16 step measured {measured['bfloat16'] * 1e3:.2f} ms" in table.summary()
    with pytest.raises(PlanError, match="float16"):
        cost.calibrate(
            model,
            (x, y),
            dtypes=("float32",),
            cache_dir=tmp_path,
            progress=False,
            measure_model_step=["float16"],
        )


def _measured_like(table: cost.CostTable, layer_seconds: dict[str, dict[str, float]]) -> None:
    for path, record in table.layers.items():
        record.seconds = dict(layer_seconds.get(path, {"float32": 0.0, "bfloat16": 0.0}))
    table.cast_seconds = {"bfloat16": {"fixed": 0.0, "per_element": 0.0}}


def test_step_correction_shares_overhead_and_scales_each_dtype(mlp):
    table = cost.predict_costs(mlp, "rtx4090", batch_size=32, dtypes=("float32", "bfloat16"))
    _measured_like(
        table,
        {
            "dense": {"float32": 0.010, "bfloat16": 0.015},
            "dense_1": {"float32": 0.010, "bfloat16": 0.015},
            "dense_2": {"float32": 0.010, "bfloat16": 0.015},
        },
    )
    # float32: layers 30 ms, step 50 ms; bfloat16: layers 45 ms, step 40 ms.
    cost._attribute_step_overhead(table, {"float32": 0.050, "bfloat16": 0.040})
    assert table.step_overhead_seconds == 0.0
    assert table.time_scale("float32") == pytest.approx(50 / 30)
    assert table.time_scale("bfloat16") == pytest.approx(40 / 45)
    assert cost.estimate(mlp, "float32", table).step_seconds == pytest.approx(0.050)
    assert cost.estimate(mlp, "bfloat16", table).step_seconds == pytest.approx(0.040)
    # Mixed: each layer carries its own dtype's correction.
    mixed = cost.estimate(
        mlp, {"dense": "bfloat16", "dense_1": "float32", "dense_2": "float32"}, table
    )
    assert mixed.layer_seconds["dense"] == pytest.approx(0.015 * 40 / 45)
    assert mixed.step_seconds == pytest.approx(0.015 * 40 / 45 + 2 * 0.010 * 50 / 30)
    # Both steps above their layers: the common part becomes a shared overhead.
    cost._attribute_step_overhead(table, {"float32": 0.050, "bfloat16": 0.055})
    assert table.step_overhead_seconds == pytest.approx(0.010)
    assert table.time_scale("float32") == pytest.approx(40 / 30)
    assert table.time_scale("bfloat16") == pytest.approx(1.0)


def test_tables_without_per_dtype_fields_read_as_before(mlp):
    table = cost.predict_costs(mlp, "rtx4090", batch_size=32)
    data = table.to_dict()
    for field in ("measured_step_seconds_by_dtype", "layer_time_scale_by_dtype"):
        del data[field]
    data.update(layer_time_scale=2.0, step_overhead_seconds=0.001, measured_step_seconds=0.5)
    old = cost.CostTable.from_dict(data)
    assert old.measured_step_seconds_by_dtype == {} and old.measured_step_seconds == 0.5
    for dtype in ("float32", "bfloat16", "float16"):
        assert old.time_scale(dtype) == 2.0
        assert old.seconds("dense", dtype) == pytest.approx(2.0 * table.seconds("dense", dtype))


def test_measuring_on_an_unsupported_backend_names_the_supported_ones(monkeypatch, mlp):
    x = np.zeros((4, 8), dtype="float32")
    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    for measure in (
        lambda: cost.calibrate(mlp, x, progress=False, use_cache=False),
        lambda: cost.measure_train_steps(mlp, x),
    ):
        with pytest.raises(BackendError, match="tensorflow and jax") as raised:
            measure()
        assert "'torch'" in str(raised.value) and "predict_costs" in str(raised.value)
