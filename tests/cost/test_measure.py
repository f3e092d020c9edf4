"""Tests for autoprec.cost.measure: calibration, its cache, whole steps and their correction."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from conftest import build_mlp

from autoprec import PrecisionPlan, cost
from autoprec.cost import measure as measure_module
from autoprec.errors import BackendError, PlanError
from autoprec.layers import layer_paths


def test_calibrate_measures_then_reuses_cache_and_invalidates_on_change(tmp_path):
    x = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    y = np.zeros((32,), dtype="int32")
    model = build_mlp()
    first = cost.calibrate(model, (x, y), repeats=2, cache_dir=tmp_path, verbose=0)
    assert first.source == "measured" and first.batch_size == 32
    assert first.stats["timed"] > 0 and first.stats["cached"] == 0
    assert first.stats["fallback"] == 0 and first.stats["model_step"] >= 1
    for path in ("dense", "dense_1", "dense_2"):
        assert all(first.layers[path].seconds[dtype] > 0 for dtype in ("float32", "float16"))
    est = cost.estimate(model, "float32", costs=first)
    assert est.float32_step_seconds == pytest.approx(first.measured_step_seconds, rel=1e-6)

    second = cost.calibrate(model, (x, y), repeats=2, cache_dir=tmp_path, verbose=0)
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
        changed, (x, y), repeats=2, cache_dir=tmp_path, verbose=0, measure_model_step=False
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
        verbose=0,
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
        verbose=0,
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
        verbose=0,
        hardware="cpu-avx512-bf16",
        measure_model_step="fast",
    )
    assert set(fast.measured_step_seconds_by_dtype) == {"float32", "bfloat16"}
    assert fast.time_scale("float16") == fast.layer_time_scale
    # The default adds float16; layers and the two steps above come from the cache.
    table = cost.calibrate(
        model, (x, y), repeats=2, cache_dir=tmp_path, verbose=0, hardware="cpu-avx512-bf16"
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
            assert cost.estimate(model, plan, costs=costs).step_seconds == pytest.approx(
                seconds, rel=1e-6
            )
            assert cost.estimate(model, dtype, costs=costs).step_seconds == pytest.approx(
                seconds, rel=1e-6
            )
    assert f"whole bfloat16 step measured {measured['bfloat16'] * 1e3:.2f} ms" in table.summary()
    with pytest.raises(PlanError, match="float16"):
        cost.calibrate(
            model,
            (x, y),
            dtypes=("float32",),
            cache_dir=tmp_path,
            verbose=0,
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
    measure_module._attribute_step_overhead(table, {"float32": 0.050, "bfloat16": 0.040})
    assert table.step_overhead_seconds == 0.0
    assert table.time_scale("float32") == pytest.approx(50 / 30)
    assert table.time_scale("bfloat16") == pytest.approx(40 / 45)
    assert cost.estimate(mlp, "float32", costs=table).step_seconds == pytest.approx(0.050)
    assert cost.estimate(mlp, "bfloat16", costs=table).step_seconds == pytest.approx(0.040)
    # Mixed: each layer carries its own dtype's correction.
    mixed = cost.estimate(
        mlp, {"dense": "bfloat16", "dense_1": "float32", "dense_2": "float32"}, costs=table
    )
    assert mixed.layer_seconds["dense"] == pytest.approx(0.015 * 40 / 45)
    assert mixed.step_seconds == pytest.approx(0.015 * 40 / 45 + 2 * 0.010 * 50 / 30)
    # Both steps above their layers: the common part becomes a shared overhead.
    measure_module._attribute_step_overhead(table, {"float32": 0.050, "bfloat16": 0.055})
    assert table.step_overhead_seconds == pytest.approx(0.010)
    assert table.time_scale("float32") == pytest.approx(40 / 30)
    assert table.time_scale("bfloat16") == pytest.approx(1.0)


def test_measuring_on_an_unsupported_backend_names_the_supported_ones(monkeypatch, mlp):
    x = np.zeros((4, 8), dtype="float32")
    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    for measure in (
        lambda: cost.calibrate(mlp, x, verbose=0, use_cache=False),
        lambda: cost.measure_train_steps(mlp, x),
    ):
        with pytest.raises(BackendError, match="tensorflow and jax") as raised:
            measure()
        assert "'torch'" in str(raised.value) and "predict_costs" in str(raised.value)


def test_clone_with_uniform_policy_copies_the_model_and_leaves_it_alone(mlp):
    assert not cost.clone_with_uniform_policy(mlp, "float16").compiled
    mlp.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    copy = cost.clone_with_uniform_policy(mlp, "bf16")
    # A compiled model's copy is compiled alike (keras.models.clone_model), with its own optimizer.
    assert copy is not mlp and copy.compiled and copy.optimizer is not mlp.optimizer
    assert [type(layer) for layer in copy.layers] == [type(layer) for layer in mlp.layers]
    assert {layer.dtype_policy.name for layer in layer_paths(copy).values()} == {"mixed_bfloat16"}
    assert {layer.dtype_policy.name for layer in layer_paths(mlp).values()} == {"float32"}
    x = np.ones((2, 8), dtype="float32")
    assert keras.backend.standardize_dtype(copy(x).dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(mlp(x).dtype) == "float32"
    float32 = cost.clone_with_uniform_policy(mlp, "float32")
    assert {layer.dtype_policy.name for layer in layer_paths(float32).values()} == {"float32"}
    with pytest.raises(PlanError, match="float8"):
        cost.clone_with_uniform_policy(mlp, "float8")


def test_a_list_batch_is_the_inputs_of_a_multi_input_model(tmp_path):
    first, second = keras.Input((4,)), keras.Input((6,))
    joined = keras.layers.Concatenate()([first, second])
    model = keras.Model([first, second], keras.layers.Dense(2)(joined))
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(8, 4)).astype("float32"), rng.normal(size=(8, 6)).astype("float32")]
    table = cost.calibrate(
        model, inputs, dtypes=("float32",), repeats=2, cache_dir=tmp_path, verbose=0
    )
    assert table.batch_size == 8 and table.stats["fallback"] == 0
    assert table.layers["dense"].seconds["float32"] > 0
    assert set(table.measured_step_seconds_by_dtype) == {"float32"}
    steps = cost.measure_train_steps(model, inputs, repeats=2)
    assert steps["float32"] > 0
