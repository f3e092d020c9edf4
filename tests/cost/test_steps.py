"""Tests for autoprec.cost.steps: uniform copies, whole training steps and the correction they give."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from conftest import build_mlp

from autoprec import PrecisionPlan, cost
from autoprec.cost import steps
from autoprec.errors import BackendError, PlanError
from autoprec.hardware import resolve_hardware
from autoprec.layers import layer_paths


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
    steps.attribute_step_overhead(table, {"float32": 0.050, "bfloat16": 0.040})
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
    steps.attribute_step_overhead(table, {"float32": 0.050, "bfloat16": 0.055})
    assert table.step_overhead_seconds == pytest.approx(0.010)
    assert table.time_scale("float32") == pytest.approx(40 / 30)
    assert table.time_scale("bfloat16") == pytest.approx(1.0)


def test_whole_step_dtypes_reads_true_fast_false_and_names():
    profile = resolve_hardware("cpu-avx512-bf16")
    dtypes = ["float32", "bfloat16", "float16"]
    assert steps.whole_step_dtypes(True, dtypes, profile) == dtypes
    assert steps.whole_step_dtypes("all", dtypes, profile) == dtypes
    assert steps.whole_step_dtypes("fast", dtypes, profile) == ["float32", "bfloat16"]
    assert steps.whole_step_dtypes(False, dtypes, profile) == []
    assert steps.whole_step_dtypes(["fp16", "float32"], dtypes, profile) == ["float32", "float16"]
    with pytest.raises(PlanError, match="measure_model_step names float16"):
        steps.whole_step_dtypes("float16", ["float32"], profile)


def test_time_train_steps_times_a_list_and_a_dict_input_model():
    first, second = keras.Input((4,), name="first"), keras.Input((6,), name="second")
    joined = keras.layers.Concatenate()([first, second])
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(8, 4)).astype("float32"), rng.normal(size=(8, 6)).astype("float32")]
    listed = keras.Model([first, second], keras.layers.Dense(2)(joined))
    timed = cost.time_train_steps(listed, arrays, ["float32", "bfloat16"], repeats=2)
    assert set(timed) == {"float32", "bfloat16"} and all(t.median > 0 for t in timed.values())
    named = keras.Model({"first": first, "second": second}, keras.layers.Dense(2)(joined))
    named.compile(optimizer="sgd", loss="mse")
    batch = ({"first": arrays[0], "second": arrays[1]}, np.zeros((8, 2), "float32"))
    assert cost.time_train_steps(named, batch, ["float32"], repeats=2)["float32"].median > 0
    with pytest.warns(DeprecationWarning, match="time_train_steps"):
        assert cost.measure_train_steps is cost.time_train_steps


def test_time_train_steps_on_an_unsupported_backend_names_the_supported_ones(monkeypatch, mlp):
    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    with pytest.raises(BackendError, match="tensorflow and jax") as raised:
        cost.time_train_steps(mlp, np.zeros((4, 8), dtype="float32"))
    assert "'torch'" in str(raised.value)


class _SumOfTwo(keras.layers.Layer):
    """Adds two projections in its own `call`: sub-layers of different dtypes clash here."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.left = keras.layers.Dense(4)
        self.right = keras.layers.Dense(4)

    def build(self, input_shape):
        self.left.build(input_shape)
        self.right.build(input_shape)

    def call(self, inputs):
        return self.left(inputs) + self.right(inputs)


def test_mixed_plans_are_timed_beside_uniform_steps_and_a_plan_that_cannot_run_is_left_out():
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(8, name="first")(inputs)
    outputs = _SumOfTwo(name="pair")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss="mse")
    copy = cost.clone_with_policies(model, {"first": "bf16", "pair/left": "float16"})
    assert copy.get_layer("first").dtype_policy.name == "mixed_bfloat16"
    assert layer_paths(copy)["pair/left"].dtype_policy.name == "mixed_float16"
    assert layer_paths(copy)["pair/right"].dtype_policy.name == "float32"
    assert model.get_layer("first").dtype_policy.name == "float32"
    with pytest.raises(PlanError, match="'missing' is not a layer"):
        cost.clone_with_policies(model, {"missing": "bfloat16"})
    batch = (np.ones((4, 8), "float32"), np.zeros((4, 4), "float32"))
    plans = {
        "fine": {"first": "bfloat16", "pair": "float32"},
        "clash": {"pair/left": "bfloat16", "pair/right": "float32"},
    }
    timings = cost.time_train_steps(model, batch, ["float32"], repeats=2, plans=plans)
    assert set(timings) == {"float32", "fine"}
    assert len(timings["fine"].samples) == 2 and timings["fine"].median > 0
    alone = cost.time_train_steps(model, batch, [], repeats=1, plans={"fine": plans["fine"]})
    assert set(alone) == {"fine"}
    assert timings["fine"].spread >= 0
    timing = type(timings["fine"])
    spread = timing((0.010, 0.011, 0.013)).spread
    assert spread == pytest.approx(1.4826 * 0.001) and timing((0.01,)).spread is None
