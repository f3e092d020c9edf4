"""Tests for autoprec.cost.measure's boundaries: mixed plans, the boundary cost and the prediction error."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from conftest import build_mlp

from autoprec import cost
from autoprec.cost import measure as boundaries


def _stack(depth: int = 6, width: int = 64) -> keras.Model:
    """Dense layers on (sequence, width) inputs: cheap matmuls, casts of 2k values per sample."""
    inputs = keras.Input((32, width))
    hidden = inputs
    for _ in range(depth):
        hidden = keras.layers.Dense(width)(hidden)
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    model = keras.Model(inputs, keras.layers.Dense(4)(pooled), name="stack")
    model.compile(optimizer="sgd", loss="mse")
    return model


def _batch(model: keras.Model, samples: int = 16) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, *model.input_shape[1:])).astype("float32")
    return x, np.zeros((samples, 4), "float32")


def test_mixed_assignment_alternates_units_with_weights_and_keeps_composites_whole(
    mlp, attention_model
):
    alternating = cost.mixed_assignment(mlp, "bf16", "alternating")
    # dense, dense_1, dense_2 hold weights; the dropout takes the dtype of the layer before it.
    assert alternating == {
        "dense": "bfloat16",
        "dropout": "bfloat16",
        "dense_1": "float32",
        "dense_2": "bfloat16",
    }
    half = cost.mixed_assignment(mlp, "bfloat16", "half")
    assert half == {
        "dense": "bfloat16",
        "dropout": "bfloat16",
        "dense_1": "float32",
        "dense_2": "float32",
    }
    # MultiHeadAttention is one unit: its projections, softmax and dropout share its dtype.
    attention = cost.mixed_assignment(attention_model, "float16", "alternating")
    inner = {path: dtype for path, dtype in attention.items() if path.startswith("attention")}
    assert set(inner.values()) == {"float16"} and len(inner) == 7
    assert attention["add"] == "float16"  # no weights: follows the attention before it
    assert attention["layer_normalization"] == "float32"
    assert attention["global_average_pooling1d"] == "float32"
    assert attention["dense"] == "float16"
    plans = cost.mixed_plans(mlp, ["float32", "bfloat16", "float16"])
    assert list(plans) == ["alternating bfloat16", "half bfloat16", "alternating float16"]
    assert plans["half bfloat16"].pattern == "half" and plans["half bfloat16"].dtypes == half
    single = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    assert cost.mixed_plans(single, ["bfloat16"]) == {}
    with pytest.raises(ValueError, match="pattern 'stripes'"):
        cost.mixed_assignment(mlp, "bfloat16", "stripes")


def test_estimate_of_a_mixed_plan_adds_the_boundary_cost_between_layers(mlp):
    table = cost.predict_costs(mlp, "rtx4090", batch_size=32)
    mixed = {"dense": "bfloat16", "dense_1": "float32", "dense_2": "bfloat16"}
    before = cost.estimate(mlp, mixed, costs=table)
    assert before.boundary_seconds == 0.0
    table.boundary_seconds = {"bfloat16": {"fixed": 1e-3, "per_element": 1e-9}}
    after = cost.estimate(mlp, mixed, costs=table)
    # dropout -> dense_1 and dense_1 -> dense_2: 16 values per sample each, 32 samples.
    expected = 2 * (1e-3 + 1e-9 * 16 * 32)
    assert after.boundary_seconds == pytest.approx(expected)
    assert after.step_seconds == pytest.approx(before.step_seconds + expected)
    assert after.cast_seconds == pytest.approx(before.cast_seconds)
    # A model input cast into the first layer is part of the uniform step: no boundary cost.
    uniform = cost.estimate(mlp, "bfloat16", costs=table)
    assert uniform.boundary_seconds == 0.0 and uniform.cast_seconds > 0
    # float16 has no figures of its own: it takes the mean of the others'.
    assert cost.estimate(
        mlp, {**mixed, "dense": "float16", "dense_2": "float16"}, costs=table
    ).boundary_seconds == pytest.approx(expected)
    assert len(boundaries.boundaries(table, cost.mixed_assignment(mlp, "bf16", "alternating"))) == 2


def _between_layers(table: cost.CostTable, dtypes) -> list[float]:
    """Each boundary between two layers: its cast plus its learned cost (seconds)."""
    return [
        table.cast_cost(elements * table.batch_size, dtype)
        + table.boundary_cost(elements * table.batch_size, dtype)
        for dtype, elements in boundaries.boundaries(table, dtypes)
    ]


def _fitted(model: keras.Model, table: cost.CostTable, factor: float, noise=None) -> dict:
    """Fits `table` from mixed steps that pay `factor` times their casts more at each boundary."""
    plans = cost.mixed_plans(model, ["bfloat16"])
    table.boundary_seconds = {}
    cast = table.cast_seconds["bfloat16"]
    measured = {}
    for name, plan in plans.items():
        predicted = cost.estimate(model, dict(plan.dtypes), costs=table).step_seconds
        extra = sum(
            factor * 2 * (cast["fixed"] + cast["per_element"] * elements * table.batch_size)
            for _, elements in boundaries.boundaries(table, plan.dtypes)
        )
        measured[name] = predicted + extra
    cost.fit_boundary_cost(model, table, plans, measured, noise)
    return {name: (plans[name], seconds) for name, seconds in measured.items()}


def test_boundary_cost_is_learned_from_a_step_that_pays_for_its_casts(tmp_path):
    model = _stack()
    table = cost.calibrate(
        model,
        _batch(model),
        dtypes=("float32", "bfloat16"),
        repeats=2,
        cache_dir=tmp_path,
        verbose=0,
        hardware="cpu-avx512-bf16",
        measure_mixed_steps=False,
    )
    assert table.boundary_seconds == {} and table.measured_plan_seconds == {}
    assert table.relative_error >= cost.DEFAULT_RELATIVE_ERROR
    assert table.cast_seconds["bfloat16"]["per_element"] > 0  # casting 2k values costs
    # Whole steps that pay three times the casts again at every boundary between layers.
    runs = _fitted(model, table, factor=3.0)
    figures = table.boundary_seconds["bfloat16"]
    assert figures["per_element"] == pytest.approx(
        3 * 2 * table.cast_seconds["bfloat16"]["per_element"]
    )
    assert figures["per_element"] > 0 and figures["fixed"] >= 0
    for name, (plan, measured) in runs.items():
        est = cost.estimate(model, dict(plan.dtypes), costs=table)
        assert est.boundary_seconds > 0
        assert est.step_seconds == pytest.approx(measured, rel=1e-9), name
        assert table.prediction_errors[f"{name}, no boundary cost"] < 0  # too fast without it
    # The half-and-half step, held out of the fit, is predicted exactly: the floor is the error.
    assert table.relative_error == cost.MIN_RELATIVE_ERROR
    # A residual inside the noise of the rounds is not fitted.
    _fitted(model, table, factor=3.0, noise=10.0)
    assert table.boundary_seconds == {"bfloat16": {"fixed": 0.0, "per_element": 0.0}}
    assert table.relative_error == 10.0
    # Casts that cost less inside the step than alone: at most the casts come off (k >= -1).
    # (The casts of the alternating plan's boundaries: 4 % of its step, so that steps five
    # times cheaper stay positive, 20 % off: beyond the 3 % noise.)
    plan = cost.mixed_plans(model, ["bfloat16"])["alternating bfloat16"]
    step = cost.estimate(model, dict(plan.dtypes), costs=table).step_seconds
    count = len(boundaries.boundaries(table, plan.dtypes))
    table.cast_seconds = {"bfloat16": {"fixed": 0.04 * step / (2 * count), "per_element": 0.0}}
    runs = _fitted(model, table, factor=-5.0, noise=0.03)
    alternating, measured = runs["alternating bfloat16"]
    est = cost.estimate(model, dict(alternating.dtypes), costs=table)
    assert _between_layers(table, alternating.dtypes) == pytest.approx(
        [0.0] * len(_between_layers(table, alternating.dtypes)), abs=1e-15
    )
    assert est.step_seconds > measured  # the fit cannot explain it: the error stays recorded
    assert table.relative_error == pytest.approx(
        max([0.03, cost.MIN_RELATIVE_ERROR] + [abs(table.prediction_errors[name]) for name in runs])
    )
    assert table.relative_error > cost.MIN_RELATIVE_ERROR
    assert table.prediction_errors["noise"] == 0.03
    loaded = cost.CostTable.from_dict(json.loads(json.dumps(table.to_dict())))
    assert loaded.boundary_seconds == table.boundary_seconds
    assert loaded.relative_error == table.relative_error
    assert loaded.prediction_errors == table.prediction_errors
    assert cost.estimate(model, dict(alternating.dtypes), costs=loaded).step_seconds == (
        pytest.approx(est.step_seconds)
    )


def test_calibrate_times_mixed_steps_fits_their_boundaries_and_caches_them(tmp_path):
    model = build_mlp()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    x = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    batch = (x, np.zeros((32,), "int32"))
    settings = dict(
        dtypes=("float32", "bfloat16"),
        repeats=3,
        cache_dir=tmp_path,
        verbose=0,
        hardware="cpu-avx512-bf16",
    )
    table = cost.calibrate(model, batch, **settings)
    assert table.stats["mixed_step"] == 2 and table.stats["mixed_steps_timed"] == 2
    assert table.stats["model_step"] == 2  # the uniform steps are counted apart
    assert set(table.measured_plan_seconds) == {"alternating bfloat16", "half bfloat16"}
    assert all(seconds > 0 for seconds in table.measured_plan_seconds.values())
    plans = cost.mixed_plans(model, ["bfloat16"])
    errors = table.prediction_errors
    alternating = plans["alternating bfloat16"]
    est = cost.estimate(model, dict(alternating.dtypes), costs=table)
    assert len(_between_layers(table, alternating.dtypes)) == 2
    assert min(_between_layers(table, alternating.dtypes)) >= -1e-15  # never makes a step faster
    # The step paid for its boundaries beyond the noise of the rounds: that is learned.
    if errors["alternating bfloat16, no boundary cost"] < -errors["noise"]:
        assert est.boundary_seconds > 0
        assert est.step_seconds == pytest.approx(table.measured_plan_seconds[alternating.name])
    assert (
        abs(errors["alternating bfloat16"])
        <= abs(errors["alternating bfloat16, no boundary cost"]) + 1e-12
    )
    # The error: the noise of the rounds and the held-out half-and-half step, at least 2 %.
    assert errors["noise"] >= 0
    assert table.relative_error == pytest.approx(
        max(
            cost.MIN_RELATIVE_ERROR,
            errors["noise"],
            abs(errors["half bfloat16"]),
            abs(errors["alternating bfloat16"]),
        )
    )
    assert "whole-step prediction error" in table.summary()
    # Uniform steps stay exact: the boundary cost applies between layers only.
    for dtype, seconds in table.measured_step_seconds_by_dtype.items():
        assert cost.estimate(model, dtype, costs=table).step_seconds == pytest.approx(seconds)
    again = cost.calibrate(model, batch, **settings)
    assert again.stats["mixed_steps_timed"] == 0 and again.stats["model_steps_timed"] == 0
    assert again.boundary_seconds == table.boundary_seconds
    assert again.relative_error == table.relative_error
    without = cost.calibrate(model, batch, measure_mixed_steps=False, **settings)
    assert without.stats["mixed_step"] == 0 and without.boundary_seconds == {}
    # Without them: the noise of the uniform steps alone, at least the stated default.
    assert without.relative_error == max(
        cost.DEFAULT_RELATIVE_ERROR, without.prediction_errors["noise"]
    )
