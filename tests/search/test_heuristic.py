"""Tests for `autoprec.search.heuristic`: `heuristic_plan` with and without a cost table."""

from __future__ import annotations

import keras

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
    from autoprec import cost

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
    assert chosen <= step(uniform) * 1.0001
    assert plan.layers["dense_5"] == "float32"  # the softmax output stays float32
