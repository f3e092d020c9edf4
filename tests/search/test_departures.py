"""Tests for autoprec.search.departures: the uniform start and the layers that leave it."""

from __future__ import annotations

import keras

from autoprec import cost
from autoprec.hardware import resolve_hardware
from autoprec.layers import describe_model
from autoprec.search import allowed_dtypes, compute_layers
from autoprec.search.heuristic import (
    Departure,
    Feasibility,
    choose_start,
    cost_departures,
    cost_source,
    ladder_assignment,
    range_blocks,
)
from autoprec.search.space import PlanCosts


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


def _costs(model, milliseconds: dict, cast_ms: float = 0.0, error: float = 0.05) -> PlanCosts:
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
    return PlanCosts(model, table, 32)


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


def test_a_range_departure_takes_its_block_along_where_that_saves_casts():
    model = _model()
    feasibility = _feasibility(model, unsafe={"block1_b": "profile: overflow"})
    costs = _costs(model, {}, cast_ms=0.4)
    assignment, start_departures = ladder_assignment("float16", feasibility)
    departures = {departure.path: departure for departure in start_departures}
    widened = range_blocks(assignment, departures, feasibility, costs)
    # block1_a in bfloat16 too: the input casts once to bfloat16, not to float16 and back.
    assert widened["block1_a"] == widened["block1_b"] == "bfloat16"
    assert widened["block2_a"] == "float16"
    assert departures["block1_a"].kind == "range" and "block of block1_b" in (
        departures["block1_a"].reason
    )


def test_cost_source_says_where_the_figures_come_from():
    model = _model()
    predicted = cost.predict_costs(model, "rtx4090", batch_size=8)
    assert cost_source(predicted, resolve_hardware("rtx4090")) == "predicted for rtx4090"
    assert cost_source(None, resolve_hardware("rtx4090")).startswith("no cost table")
