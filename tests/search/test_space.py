"""Tests for `autoprec.search.space`: groups, allowed dtypes, float16 feasibility and predicted plan costs."""

from __future__ import annotations

import keras
import numpy as np

from autoprec import PrecisionPlan, cost, numerics
from autoprec.layers import LayerInfo, describe_model
from autoprec.profiler import LayerProfile, Profile, TensorStats
from autoprec.search import allowed_dtypes, compute_layers, float16_unsafe_layers, group_layers
from autoprec.search.space import (
    PlanCosts,
    plan_from_assignment,
    run_profiler,
    with_container_dtypes,
)


def test_group_layers_by_block_and_count():
    paths = ["conv1", "conv2_block1_1", "conv2_block1_2", "block_3_a", "block_3_b", "head"]
    groups = group_layers(paths, "block", separate={"head"})
    assert groups == [
        ["conv1"],
        ["conv2_block1_1", "conv2_block1_2"],
        ["block_3_a", "block_3_b"],
        ["head"],
    ]
    assert sum(len(group) for group in group_layers(paths, 3, separate={"head"})) == 6
    assert len(group_layers(paths, "layer")) == 6


def _stats(values) -> TensorStats:
    histogram, zeros, nonfinite = numerics.exponent_histogram(values)
    flat = np.abs(np.asarray(values, np.float64))
    finite = flat[np.isfinite(flat)]
    return TensorStats(
        count=len(values),
        zeros=zeros,
        nonfinite=nonfinite,
        max_abs=float(finite.max()),
        min_nonzero_abs=float(finite[finite > 0].min()),
        sum_abs=float(finite.sum()),
        sum_squares=float((finite**2).sum()),
        histogram=histogram,
    )


def _layer(path, outputs=(0.5, -1.0, 3.0), gradients=None, internals=None) -> LayerProfile:
    return LayerProfile(
        path=path,
        class_name="Dense",
        dtype="float32",
        activations={"output": _stats(list(outputs))},
        activation_gradients={} if gradients is None else {"output": _stats(list(gradients))},
        weights={},
        weight_gradients={},
        internals={} if internals is None else {"attention_logits": _stats(list(internals))},
    )


def _profile() -> Profile:
    layers = [
        _layer("safe", gradients=[1e-3, 2e-4]),
        _layer("nonfinite", outputs=[1.0, np.inf]),
        _layer("overflow", internals=[1e5, 2.0]),
        _layer("underflow", outputs=[1e-9] * 10 + [1.0]),
        _layer("gradient_nan", gradients=[1e-3, np.nan]),
        _layer("gradient_range", gradients=[1e4] + [1e-12] * 10),
    ]
    return Profile({layer.path: layer for layer in layers}, steps=1, model_name="synthetic")


def test_float16_unsafe_layers_says_why_for_every_unsafe_reason():
    prof = _profile()
    unsafe = float16_unsafe_layers(prof)
    assert list(unsafe) == list(prof.float16_unsafe_layers)
    assert "safe" not in unsafe
    assert "non-finite forward" in unsafe["nonfinite"]
    assert "65504" in unsafe["overflow"] and "1e+05" in unsafe["overflow"]
    assert "flush to zero in float16" in unsafe["underflow"]
    assert "non-finite gradient" in unsafe["gradient_nan"]
    assert "no float16 loss scale fits" in unsafe["gradient_range"]
    assert all(reason.startswith("profile: ") for reason in unsafe.values())
    assert float16_unsafe_layers(None) == {}


def test_allowed_dtypes_drops_float16_where_the_profile_says_unsafe_and_keeps_float32():
    prof = _profile()
    unsafe = float16_unsafe_layers(prof)
    infos = {
        path: LayerInfo(
            path=path,
            class_name="Dense",
            keras_path=path,
            parameters=1,
            weight_shapes=((1,),),
            is_container=False,
            pass_through=False,
            follows=None,
        )
        for path in prof.layers
    }
    compute = list(infos)
    allowed, removed = allowed_dtypes(
        compute, infos, ["float32", "bfloat16", "float16"], unsafe, keep_float32=["safe"]
    )
    assert allowed["safe"] == ("float32",)
    assert removed["safe"] == {"bfloat16": "keep_float32", "float16": "keep_float32"}
    assert allowed["overflow"] == ("float32", "bfloat16")
    assert removed["overflow"] == {"float16": unsafe["overflow"]}


def test_a_profiled_overflow_rules_out_float16_for_that_layer_only():
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(
        64, name="wide", kernel_initializer=keras.initializers.Constant(1.0)
    )(inputs)
    outputs = keras.layers.Dense(1, name="head", kernel_initializer="zeros")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss="mse")
    x = np.full((32, 16), 8000.0, "float32")  # wide's outputs: 16 * 8000 > 65504
    y = np.zeros((32, 1), "float32")
    prof = run_profiler(model, (x, y), steps=1, batch_size=32)
    assert isinstance(prof, Profile)
    unsafe = float16_unsafe_layers(prof)
    assert "wide" in unsafe and "65504" in unsafe["wide"]
    assert "head" not in unsafe or "65504" not in unsafe["head"]
    # With the model, the layer that reads those values too: Keras casts its inputs.
    reached = float16_unsafe_layers(prof, model)
    assert "receives values up to 1.28e+05 from wide" in reached["head"]
    assert reached["wide"] == unsafe["wide"]


def test_an_overflow_reaches_the_layers_that_read_it_through_raw_arithmetic_as_scaled():
    inputs = keras.Input((16,))
    big = keras.layers.Dense(8, name="big", kernel_initializer="ones")(inputs)
    small = keras.layers.Dense(8, name="small")(inputs)
    summed = keras.layers.LayerNormalization(name="summed")(big + small)
    scaled = keras.layers.Dense(8, name="scaled")(keras.layers.Dropout(0.1)(big) * 1e-3)
    model = keras.Model(inputs, [summed, scaled])
    model.compile(optimizer="sgd", loss="mse")
    x = np.full((32, 16), 8000.0, "float32")
    prof = run_profiler(model, (x, (np.zeros((32, 8)), np.zeros((32, 8)))), steps=1)
    reached = float16_unsafe_layers(prof, model)
    assert set(reached) == {"big", "summed"}
    assert "receives values up to 1.28e+05 from big" in reached["summed"]


def test_a_container_gets_the_dtype_its_sub_layers_share():
    inputs = keras.Input((8, 16))
    hidden = keras.layers.MultiHeadAttention(2, 8, name="mha")(inputs, inputs)
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(pooled))
    model(np.zeros((1, 8, 16), "float32"))
    infos = describe_model(model)
    compute = compute_layers(infos)
    uniform = plan_from_assignment(model, infos, dict.fromkeys(compute, "bfloat16")).resolve()
    assert uniform["mha"] == "bfloat16"  # as Keras' global mixed_bfloat16 sets it
    mixed = {path: "float32" if path.endswith("softmax") else "bfloat16" for path in compute}
    assert plan_from_assignment(model, infos, mixed).resolve()["mha"] == "float32"
    assert with_container_dtypes(infos, {"head": "bfloat16"}) == {"head": "bfloat16"}
    assert (
        with_container_dtypes(infos, {"mha": "float32", **dict.fromkeys(compute, "bfloat16")})[
            "mha"
        ]
        == "float32"
    )  # a container the assignment names keeps its dtype


def _model() -> keras.Model:
    inputs = keras.Input((1024,))
    hidden = keras.layers.Dense(4096, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(10)(hidden))


def test_steps_agree_with_estimate_and_are_cached():
    model = _model()
    table = cost.predict_costs(model, "rtx4090", batch_size=4096)
    costs = PlanCosts(model, table, 4096)
    compute = compute_layers(describe_model(model))
    assignment = dict.fromkeys(compute, "bfloat16")
    seconds, activation_bytes = costs.step(assignment)
    assert seconds > 0 and activation_bytes > 0
    assert costs.step(assignment) == (seconds, activation_bytes)
    keras_policy = cost.estimate(
        model, PrecisionPlan.uniform(model, "bfloat16"), costs=table, batch_size=4096
    )
    assert costs.uniform_seconds("bfloat16") == keras_policy.step_seconds
    assert costs.step(dict.fromkeys(compute, "float32"))[0] > seconds
    assert costs.layer_seconds(compute[0], "float32") == table.seconds(compute[0], "float32", 4096)
    assert costs.layer_seconds("no/such/layer", "float32") is None
    assert costs.relative_error == table.relative_error


def test_without_a_table_parameters_rank_the_plans():
    model = _model()
    costs = PlanCosts(model, None, 32)
    compute = compute_layers(describe_model(model))
    assert not costs.available and costs.relative_error is None
    assert (
        costs.step(dict.fromkeys(compute, "bfloat16"))[0]
        < costs.step(dict.fromkeys(compute, "float32"))[0]
    )
