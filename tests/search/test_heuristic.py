"""Tests for `autoprec.search.heuristic`: `heuristic_plan` with and without a cost table."""

from __future__ import annotations

import logging

import keras

from autoprec import cost
from autoprec.search import heuristic_plan


def test_heuristic_keeps_softmax_head_and_bisects(mlp):
    plan = heuristic_plan(mlp, hardware="rtx4090")
    assert plan.layers["dense_2"] == "float32"  # output (softmax) layer
    assert plan.layers["dense"] != "float32"
    checked = heuristic_plan(
        mlp, hardware="rtx4090", check=lambda p: p.layers["dense"] == "float32"
    )
    assert checked.layers["dense"] == "float32"
    assert checked.layers["dense_1"] != "float32"


def test_heuristic_whole_plan_is_no_slower_than_float32_or_a_uniform_16_bit_plan():
    inputs = keras.Input((256,))
    hidden = inputs
    for width in (2048, 16, 2048, 16, 2048):  # wide layers pay in 16-bit, narrow ones cast
        hidden = keras.layers.Dense(width, activation="relu")(hidden)
    outputs = keras.layers.Dense(10, activation="softmax")(hidden)
    model = keras.Model(inputs, outputs)
    table = cost.predict_costs(model, "rtx4090", batch_size=256)
    plan = heuristic_plan(model, costs=table, hardware="rtx4090")

    def step(dtypes):
        return cost.estimate(model, dtypes, costs=table, batch_size=256).step_seconds

    chosen = step(dict(plan.layers))
    uniform = {
        path: ("bfloat16" if path.startswith("dense") and path != "dense_5" else "float32")
        for path in plan.layers
    }
    assert chosen <= step({path: "float32" for path in plan.layers}) + 1e-12
    # A uniform plan faster by less than the prediction's error is not worth taking.
    assert chosen <= step(uniform) / (1 - table.relative_error) * 1.0001
    assert plan.layers["dense_5"] == "float32"  # the softmax output stays float32


def _four_dense() -> keras.Model:
    inputs = keras.Input((64,))
    hidden = inputs
    for name in ("small_gain", "large_gain", "slower"):
        hidden = keras.layers.Dense(64, activation="relu", name=name)(hidden)
    return keras.Model(inputs, keras.layers.Dense(4, activation="softmax", name="head")(hidden))


def _hand_table(model: keras.Model, milliseconds: dict, error: float) -> cost.CostTable:
    """A cost table whose layers cost `{path: (float32 ms, bfloat16 ms)}`; casts and overhead free."""
    table = cost.predict_costs(model, "rtx4090", batch_size=32, dtypes=("float32", "bfloat16"))
    for path, record in table.layers.items():
        full, half = milliseconds.get(path, (0.0, 0.0))
        record.seconds = {"float32": full * 1e-3, "bfloat16": half * 1e-3}
    table.cast_seconds = {"bfloat16": {"fixed": 0.0, "per_element": 0.0}}
    table.step_overhead_seconds = 0.0
    table.relative_error = error
    return table


def test_heuristic_refuses_a_demotion_whose_gain_is_inside_the_prediction_error(caplog):
    model = _four_dense()
    # small_gain: 5 % faster in bfloat16; large_gain: 50 %; slower: three times slower.
    costs = {"small_gain": (1.0, 0.95), "large_gain": (1.0, 0.5), "slower": (1.0, 3.0)}
    with caplog.at_level(logging.INFO, logger="autoprec"):
        plan = heuristic_plan(
            model,
            costs=_hand_table(model, costs, error=0.10),
            hardware="rtx4090",
            dtypes=["float32", "bfloat16"],
        )
    assert plan.layers["small_gain"] == "float32"  # 0.05 ms of 1 ms: inside the 10 % error
    assert plan.layers["large_gain"] == "bfloat16"
    assert plan.layers["slower"] == "float32" and plan.layers["head"] == "float32"
    assert (
        "1 layer(s) stay float32" in caplog.text and "small_gain (0.050 of 1.000 ms)" in caplog.text
    )
    assert "using per-layer" in caplog.text
    # The same gain beyond a 1 % error is taken.
    precise = heuristic_plan(
        model,
        costs=_hand_table(model, costs, error=0.01),
        hardware="rtx4090",
        dtypes=["float32", "bfloat16"],
    )
    assert precise.layers["small_gain"] == "bfloat16"
    assert precise.layers["large_gain"] == "bfloat16"


def test_whole_plan_stays_float32_unless_predicted_faster_by_more_than_the_error(caplog):
    model = _four_dense()
    # Each 16-bit layer gains 20 % of its own time, but the step is mostly the float32 head.
    costs = {
        "small_gain": (1.0, 0.8),
        "large_gain": (1.0, 0.8),
        "slower": (1.0, 3.0),
        "head": (10.0, 10.0),
    }
    table = _hand_table(model, costs, error=0.05)
    with caplog.at_level(logging.INFO, logger="autoprec"):
        plan = heuristic_plan(
            model, costs=table, hardware="rtx4090", dtypes=["float32", "bfloat16"]
        )
    # per-layer: 12.6 ms against float32's 13 ms, 3 % faster: inside the 5 % error.
    assert set(plan.layers.values()) == {"float32"}
    assert "using float32: no other plan is predicted faster than float32" in caplog.text
    table.relative_error = 0.02
    assert (
        heuristic_plan(
            model, costs=table, hardware="rtx4090", dtypes=["float32", "bfloat16"]
        ).layers["large_gain"]
        == "bfloat16"
    )
    # A uniform plan within the error of the per-layer one is preferred: it is simpler.
    costs["slower"] = (1.0, 0.97)
    table = _hand_table(model, costs, error=0.05)
    table.layers["head"].seconds = {"float32": 1e-3, "bfloat16": 1e-3}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="autoprec"):
        plan = heuristic_plan(
            model, costs=table, hardware="rtx4090", dtypes=["float32", "bfloat16"]
        )
    # float32 4 ms, uniform 3.57 ms (11 % faster), per-layer 3.6 ms (slower's 3 % gain is
    # inside the error, so it stays float32 there): the uniform plan, which the per-layer one
    # does not beat by more than the error.
    assert plan.layers["slower"] == "bfloat16" and plan.layers["small_gain"] == "bfloat16"
    assert "using uniform bfloat16" in caplog.text
