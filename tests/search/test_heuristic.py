"""Tests for `autoprec.search.heuristic`: the fastest uniform policy, left only on evidence."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
from conftest import build_attention_model, build_cnn

import autoprec
from autoprec import PrecisionPlan, cost
from autoprec.search import compute_layers, heuristic_plan


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
