"""Tests for `autoprec.search.heuristic`: the fastest uniform policy, left only on evidence; float8 choices."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
from conftest import build_attention_model, build_cnn

import autoprec
from autoprec import PrecisionPlan, cost
from autoprec.cost import predict_costs
from autoprec.hardware import resolve_hardware
from autoprec.layers import describe_model
from autoprec.search import allowed_dtypes, compute_layers, heuristic_plan
from autoprec.search.heuristic import (
    Departure,
    Feasibility,
    choose_start,
    cost_departures,
    cost_source,
    ladder_assignment,
)
from autoprec.search.space import PlanCosts


def _resnet_block() -> keras.Model:
    """Conv/BatchNorm/ReLU with a residual add and a softmax head: the shape of a ResNet."""
    inputs = keras.Input((32, 32, 3))
    hidden = keras.layers.Conv2D(32, 3, padding="same")(inputs)
    for _ in range(2):
        branch = keras.layers.Conv2D(32, 3, padding="same")(hidden)
        branch = keras.layers.BatchNormalization()(branch)
        branch = keras.layers.ReLU()(branch)
        hidden = keras.layers.Add()([hidden, branch])
    pooled = keras.layers.GlobalAveragePooling2D()(hidden)
    model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(pooled))
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def _encoder() -> keras.Model:
    """A transformer encoder block: attention, LayerNormalization, a wide MLP, softmax head."""
    inputs = keras.Input((64, 128))
    attended = keras.layers.MultiHeadAttention(4, 32)(inputs, inputs)
    hidden = keras.layers.LayerNormalization()(keras.layers.Add()([inputs, attended]))
    wide = keras.layers.Dense(512, activation="gelu")(hidden)
    hidden = keras.layers.LayerNormalization()(hidden + keras.layers.Dense(128)(wide))
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    model = keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(pooled))
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def _compiled(model: keras.Model, loss: str = "sparse_categorical_crossentropy") -> keras.Model:
    model.compile("adam", loss)
    return model


MODELS = {
    "resnet_block": _resnet_block,
    "encoder": _encoder,
    "cnn": lambda: _compiled(build_cnn()),
    "attention": lambda: _compiled(build_attention_model()),
}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize(
    ("card", "batch_size"), [("rtx2080ti", 64), ("rtx4090", 32), ("h100", 256)]
)
def test_the_plan_is_predicted_no_slower_than_any_uniform_policy(name, card, batch_size):
    model = MODELS[name]()
    table = cost.predict_costs(model, card, batch_size=batch_size)
    plan = heuristic_plan(model, costs=table, hardware=card)
    hardware = autoprec.hardware.resolve_hardware(card)

    def step(candidate: PrecisionPlan) -> float:
        return cost.estimate(model, candidate, costs=table, batch_size=batch_size).step_seconds

    chosen = step(plan)
    for dtype in ("float32", "bfloat16", "float16"):
        if dtype == "float32" or hardware.is_fast(dtype):
            assert chosen <= step(PrecisionPlan.uniform(model, dtype)) * (1 + 1e-9), dtype
    start = plan.metadata["start"]
    steps = start["predicted_step_ms"]
    assert steps[start["policy"]] == min(steps.values())
    if start["policy"] == "float32":
        return
    # Normalisation, softmax and the classification head are not protected by name.
    layers = plan.resolve()
    classes = {layer.name: type(layer).__name__ for layer in model._flatten_layers()}
    for path, dtype in layers.items():
        if "Normalization" in classes.get(path.split("/")[-1], ""):
            assert dtype != "float32" or path in plan.metadata["evidence"], path


def test_with_no_departure_the_plan_is_keras_own_policy_on_every_layer():
    model = _resnet_block()
    table = cost.predict_costs(model, "rtx4090", batch_size=64)
    plan = heuristic_plan(model, costs=table, hardware="rtx4090", dtypes=["float32", "bfloat16"])
    assert plan.metadata["evidence"] == {}
    assert plan.resolve() == PrecisionPlan.uniform(model, "bfloat16").resolve()
    start = plan.metadata["start"]
    assert start["costs"] == "predicted for rtx4090"
    assert start["predicted_step_ms"]["bfloat16"] < start["predicted_step_ms"]["float32"]


def test_without_a_cost_table_the_start_is_the_fast_16_bit_dtype_and_check_bisects(mlp):
    mlp.compile("adam", "sparse_categorical_crossentropy")
    plan = heuristic_plan(mlp, hardware="rtx4090")
    assert set(plan.resolve().values()) == {"bfloat16"}  # the softmax head included
    assert set(heuristic_plan(mlp, hardware="rtx2080ti").resolve().values()) == {"float16"}
    checked = heuristic_plan(
        mlp, hardware="rtx4090", check=lambda p: p.layers.get("dense", "float32") == "float32"
    )
    assert checked.layers["dense"] == "float32" and checked.layers["dense_1"] == "bfloat16"
    assert checked.metadata["evidence"]["dense"]["kind"] == "budget"


def test_a_regression_output_and_a_user_glob_stay_float32_with_their_evidence(mlp):
    mlp.compile("adam", "mse")
    plan = heuristic_plan(mlp, hardware="rtx4090", keep_float32=["dense_1"])
    evidence = plan.metadata["evidence"]
    assert plan.layers["dense_2"] == "float32" and evidence["dense_2"]["kind"] == "budget"
    assert "'mse'" in evidence["dense_2"]["reason"]
    assert plan.layers["dense_1"] == "float32" and evidence["dense_1"]["kind"] == "user"
    assert plan.layers["dense"] == "bfloat16" and "dense" not in evidence


def _four_dense() -> keras.Model:
    inputs = keras.Input((64,))
    hidden = inputs
    for name in ("small_gain", "large_gain", "slower"):
        hidden = keras.layers.Dense(64, activation="relu", name=name)(hidden)
    model = keras.Model(inputs, keras.layers.Dense(4, activation="softmax", name="head")(hidden))
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def _hand_table(
    model: keras.Model, milliseconds: dict, error: float, cast_ms: float = 0.0
) -> cost.CostTable:
    """A cost table whose layers cost `{path: (float32 ms, bfloat16 ms)}`; no step overhead."""
    table = cost.predict_costs(model, "rtx4090", batch_size=32, dtypes=("float32", "bfloat16"))
    for path, record in table.layers.items():
        full, half = milliseconds.get(path, (0.0, 0.0))
        record.seconds = {"float32": full * 1e-3, "bfloat16": half * 1e-3}
    table.cast_seconds = {"bfloat16": {"fixed": cast_ms * 1e-3, "per_element": 0.0}}
    table.step_overhead_seconds = 0.0
    table.relative_error = error
    return table


def test_a_layer_leaves_the_start_only_when_slower_there_beyond_the_error(caplog):
    model = _four_dense()
    # small_gain: bfloat16 5 % faster; large_gain: twice as fast; slower: 1.5 times slower.
    costs = {
        "small_gain": (1.0, 0.95),
        "large_gain": (1.0, 0.5),
        "slower": (1.0, 1.5),
        "head": (0.2, 0.2),
    }
    with caplog.at_level(logging.INFO, logger="autoprec"):
        plan = heuristic_plan(
            model,
            costs=_hand_table(model, costs, error=0.10),
            hardware="rtx4090",
            dtypes=["float32", "bfloat16"],
        )
    assert plan.metadata["start"]["policy"] == "bfloat16"
    assert plan.layers["small_gain"] == plan.layers["large_gain"] == "bfloat16"
    assert plan.layers["head"] == "bfloat16"  # Keras computes the loss in float32 already
    assert plan.layers["slower"] == "float32"
    entry = plan.metadata["evidence"]["slower"]
    assert entry["kind"] == "cost" and entry["from"] == "bfloat16"
    assert (
        "predicted for rtx4090: slower 1.500 ms in bfloat16, 1.000 ms in float32"
        in (entry["reason"])
    )
    assert "start: uniform bfloat16; 1 layer(s) leave it (1 cost)" in caplog.text


def test_a_move_whose_casts_cost_more_than_it_saves_is_not_taken():
    model = _four_dense()
    costs = {"small_gain": (1.0, 0.5), "large_gain": (1.0, 0.5), "slower": (1.0, 1.2)}
    # slower is 0.2 ms slower in bfloat16, but leaving it adds two 0.15 ms casts.
    plan = heuristic_plan(
        model,
        costs=_hand_table(model, costs, error=0.05, cast_ms=0.15),
        hardware="rtx4090",
        dtypes=["float32", "bfloat16"],
    )
    assert plan.layers["slower"] == "bfloat16" and plan.metadata["evidence"] == {}
    # Where bfloat16 is slower everywhere, the start is float32.
    slow = {path: (1.0, 1.5) for path in ("small_gain", "large_gain", "slower", "head")}
    plan = heuristic_plan(
        model,
        costs=_hand_table(model, slow, error=0.05),
        hardware="rtx4090",
        dtypes=["float32", "bfloat16"],
    )
    assert set(plan.resolve().values()) == {"float32"}
    assert plan.metadata["start"]["policy"] == "float32"


def test_a_float16_card_keeps_only_the_overflowing_layer_out_of_float16():
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(256, activation="relu", name="wide")(inputs)
    big = keras.layers.Dense(256, name="overflows", kernel_initializer="ones")(hidden)
    hidden = keras.layers.Dense(256, activation="relu", name="after")(big * 1e-4)
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="head")(hidden))
    model.compile("adam", "sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(64, 16)) * 3000).astype("float32")
    y = rng.integers(0, 3, 64)
    profile = autoprec.profile(model, (x, y), steps=2, batch_size=32, verbose=0)
    assert not profile.layers["overflows"].float16_safe
    table = cost.predict_costs(model, "rtx2080ti", batch_size=4096)
    plan = heuristic_plan(model, profile, costs=table, hardware="rtx2080ti")
    entry = plan.metadata["evidence"]["overflows"]
    assert plan.layers["overflows"] == "float32" and entry["kind"] == "range"
    assert "65504" in entry["reason"]
    assert plan.layers["wide"] == plan.layers["after"] == "float16"

    def step(candidate) -> float:
        return cost.estimate(model, candidate, costs=table, batch_size=4096).step_seconds

    # Faster than float32: the per-layer plan wins where uniform float16 is ruled out.
    assert step(plan) < step(PrecisionPlan.uniform(model, "float32"))
    assert "overflows" in compute_layers(plan.layer_info)


def _model() -> keras.Model:
    inputs = keras.Input((64,))
    hidden = inputs
    for name in ("block1_a", "block1_b", "block2_a", "block2_b"):
        hidden = keras.layers.Dense(64, activation="relu", name=name)(hidden)
    return keras.Model(inputs, keras.layers.Dense(4, name="head")(hidden))


def _feasibility(model, unsafe=None, floors=None, keep=()) -> Feasibility:
    infos = describe_model(model)
    compute = compute_layers(infos)
    allowed, removed = allowed_dtypes(
        compute, infos, ("float32", "bfloat16", "float16"), unsafe or {}, list(keep)
    )
    return Feasibility(tuple(compute), allowed, removed, floors or {})


def _table(model, milliseconds: dict, cast_ms: float = 0.0, error: float = 0.05):
    """`{path: (float32, bfloat16, float16) ms}`; casts `cast_ms` each, no step overhead."""
    table = cost.predict_costs(model, "rtx3090", batch_size=32)
    for path, record in table.layers.items():
        full, brain, half = milliseconds.get(path, (1.0, 0.5, 0.5))
        record.seconds = {"float32": full * 1e-3, "bfloat16": brain * 1e-3, "float16": half * 1e-3}
    table.cast_seconds = {
        dtype: {"fixed": cast_ms * 1e-3, "per_element": 0.0} for dtype in ("bfloat16", "float16")
    }
    table.step_overhead_seconds = 0.0
    table.relative_error = error
    return table


def _costs(model, milliseconds: dict, cast_ms: float = 0.0, error: float = 0.05) -> PlanCosts:
    return PlanCosts(model, _table(model, milliseconds, cast_ms, error), 32)


def test_the_ladder_widens_each_layer_that_may_not_take_the_dtype_and_says_why():
    model = _model()
    feasibility = _feasibility(
        model,
        unsafe={"block2_a": "profile: forward values up to 1e+05"},
        floors={"head": "the loss 'mse' reads the predictions"},
        keep=["block1_a"],
    )
    assignment, departures = ladder_assignment("float16", feasibility)
    assert assignment == {
        "block1_a": "float32",
        "block1_b": "float16",
        "block2_a": "bfloat16",
        "block2_b": "float16",
        "head": "float32",
    }
    kinds = {departure.path: departure.kind for departure in departures}
    assert kinds == {"block1_a": "user", "block2_a": "range", "head": "budget"}
    assert ladder_assignment("float32", feasibility)[1] == ()


def test_the_start_is_the_fastest_policy_and_uniform_ones_are_the_ones_never_to_lose_to():
    model = _model()
    feasibility = _feasibility(model, unsafe={"block2_a": "profile: overflow"})
    hardware = resolve_hardware("rtx3090")
    costs = _costs(model, {"head": (1.0, 0.9, 0.4)})
    start = choose_start(feasibility, ("float32", "bfloat16", "float16"), hardware, costs)
    assert start.dtype == "float16"  # float16 where its range holds, bfloat16 at block2_a
    assert set(start.uniform) == {"float32", "bfloat16"}  # float16 is not uniform here
    assert start.step_seconds["float16"] < start.step_seconds["bfloat16"]
    assert [departure.path for departure in start.departures] == ["block2_a"]
    assert start.to_dict("predicted for rtx3090")["costs"] == "predicted for rtx3090"
    without = choose_start(
        feasibility, ("float32", "float16"), hardware, PlanCosts(model, None, 32)
    )
    assert without.dtype == "float16" and without.step_seconds == {}


def test_a_block_moves_together_where_one_layer_alone_would_cost_its_casts():
    model = _model()
    feasibility = _feasibility(model, floors={"head": "the loss 'mse' reads the predictions"})
    # block2_a is 0.3 ms slower in bfloat16, block2_b 0.04 ms (inside the 5 % error); a cast
    # costs 0.4 ms: block2_a alone would add two casts, the block moves the head's cast only.
    costs = _costs(model, {"block2_a": (1.0, 1.3, 1.3), "block2_b": (1.0, 1.04, 1.04)}, 0.4)
    assignment = dict.fromkeys(feasibility.compute, "bfloat16")
    assignment["head"] = "float32"
    departures: dict[str, Departure] = {}
    moved = cost_departures(
        assignment, departures, feasibility, costs, "bfloat16", "predicted for rtx3090"
    )
    assert moved["block2_a"] == moved["block2_b"] == "float32"
    assert moved["block1_a"] == moved["block1_b"] == "bfloat16"
    assert departures["block2_a"].kind == "cost"
    assert "block block2_a .. block2_b (2 layers)" in departures["block2_a"].reason
    assert costs.step(moved)[0] < costs.step(assignment)[0]
    alone = dict(assignment, block2_a="float32")
    assert costs.step(alone)[0] > costs.step(assignment)[0]  # why block2_a alone stays


def _profile(model, outputs: dict) -> autoprec.Profile:
    """A one-step profile: each compute layer's output values (`outputs[path]`, else 0.5 and 2)."""
    layers = {}
    for path in compute_layers(describe_model(model)):
        values = np.asarray(outputs.get(path, [0.5, 2.0]), np.float64)
        histogram, zeros, nonfinite = autoprec.numerics.exponent_histogram(values)
        stats = autoprec.profiler.TensorStats(
            count=len(values),
            zeros=zeros,
            nonfinite=nonfinite,
            max_abs=float(np.abs(values).max()),
            min_nonzero_abs=float(np.abs(values).min()),
            sum_abs=float(np.abs(values).sum()),
            sum_squares=float((values**2).sum()),
            histogram=histogram,
        )
        layers[path] = autoprec.profiler.LayerProfile(
            path, "Dense", "float32", {"output": stats}, {}, {}, {}, {}
        )
    return autoprec.Profile(layers, steps=1)


def test_a_range_departure_moves_alone_where_its_block_would_save_casts():
    model = _model()
    model.compile("adam", "sparse_categorical_crossentropy")
    profile = _profile(model, {"block1_b": [1e-9] * 10 + [1.0]})  # flushes to zero in float16
    assert list(profile.float16_unsafe_layers) == ["block1_b"]
    # block1_a in float32 too would save a cast pair (0.6 ms) for 0.5 ms: no evidence moves it.
    plan = heuristic_plan(
        model,
        profile,
        costs=_table(model, {}, cast_ms=0.3),
        hardware="rtx3090",
        dtypes=["float32", "float16"],
    )
    assert plan.layers["block1_b"] == "float32", plan.metadata
    assert plan.layers["block1_a"] == "float16", plan.metadata
    assert plan.layers["block2_a"] == plan.layers["block2_b"] == "float16"
    assert list(plan.metadata["evidence"]) == ["block1_b"]


def test_cost_source_says_where_the_figures_come_from():
    model = _model()
    predicted = cost.predict_costs(model, "rtx4090", batch_size=8)
    assert cost_source(predicted, resolve_hardware("rtx4090")) == "predicted for rtx4090"
    assert cost_source(None, resolve_hardware("rtx4090")).startswith("no cost table")


def mixed_width_model(features: int = 256) -> keras.Model:
    """A wide MLP block beside a narrow one and a head: float8 pays only for the wide matmuls."""
    inputs = keras.Input((32, features))
    wide = keras.layers.Dense(2048, activation="gelu", name="wide_up")(inputs)
    wide = keras.layers.Dense(1024, name="wide_down")(wide)
    narrow = keras.layers.Dense(48, activation="relu", name="narrow")(wide)
    odd = keras.layers.Dense(1000, name="odd_width")(narrow)  # 1000 is no multiple of 16
    pooled = keras.layers.GlobalAveragePooling1D()(odd)
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(pooled)
    model = keras.Model(inputs, outputs, name="mixed_width")
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def data(features: int = 256, outliers: bool = False, samples: int = 64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 32, features)).astype("float32")
    if outliers:
        x[..., :3] *= 1e4  # a few outlier features, as LLM activations have
    y = rng.integers(0, 10, size=(samples,)).astype("int32")
    return x, y


def heuristic(model, x, y):
    prof = autoprec.profile(model, (x, y), steps=6, batch_size=8, verbose=0)
    table = predict_costs(model, "rtx4090", batch_size=256, x=x[:2])
    return prof, table, autoprec.heuristic_plan(model, prof, costs=table, hardware="rtx4090")


def test_float8_goes_to_wide_layers_only_and_never_to_the_head():
    model = mixed_width_model()
    x, y = data()
    _, table, plan = heuristic(model, x, y)
    assert plan.layers["wide_down"] == "float8"  # K = 2048: the float8 matmuls pay
    assert plan.metadata["evidence"]["wide_down"]["kind"] == "float8"
    # K = 256: quantizing costs about what the float8 matmuls save; it is float8 only if faster.
    faster = table.layer_seconds("wide_up", "float8") < table.layer_seconds("wide_up", "bfloat16")
    assert (plan.layers["wide_up"] == "float8") == faster
    assert table.layer_seconds("narrow", "float8") > table.layer_seconds("narrow", "bfloat16")
    assert table.layer_seconds("odd_width", "float8") > table.layer_seconds("odd_width", "bfloat16")
    assert plan.layers["narrow"] != "float8" and plan.layers["odd_width"] != "float8"
    assert plan.layers["head"] != "float8"


def test_outlier_input_features_keep_their_layer_out_of_float8():
    model = mixed_width_model()
    x, y = data(outliers=True)
    prof, _, plan = heuristic(model, x, y)
    reason = prof.float8_unsafe_reasons["wide_up"]
    assert "inputs" in reason and "E4M3" in reason
    assert plan.layers["wide_up"] != "float8"


def test_without_fp8_hardware_nothing_is_float8():
    model = mixed_width_model()
    x, y = data()
    table = predict_costs(model, "rtx3090", batch_size=256, x=x[:2])
    plan = autoprec.heuristic_plan(model, costs=table, hardware="rtx3090")
    assert "float8" not in plan.resolve().values()
    assert table.layer_seconds("wide_up", "float8") is None
