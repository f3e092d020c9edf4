"""Tests for autoprec.cost.table: JSON round trip, old tables, summary."""

from __future__ import annotations

import pytest

from autoprec import cost
from autoprec.errors import PlanError


def test_cost_table_round_trips_through_json(tmp_path, attention_model):
    table = cost.predict_costs(attention_model, "rtx3060", batch_size=16)
    loaded = cost.CostTable.load(table.save(tmp_path / "costs.json"))
    assert loaded.to_dict() == table.to_dict()
    assert "attention" in table.summary()
    (tmp_path / "bad.json").write_text('{"device": "x"}')
    with pytest.raises(PlanError, match="bad.json"):
        cost.CostTable.load(tmp_path / "bad.json")


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


def test_boundary_costs_and_the_prediction_error_round_trip_and_old_tables_lack_them(tmp_path, mlp):
    table = cost.predict_costs(mlp, "rtx4090", batch_size=32)
    assert table.relative_error == cost.DEFAULT_RELATIVE_ERROR and table.boundary_seconds == {}
    table.boundary_seconds = {"bfloat16": {"fixed": 2e-5, "per_element": 3e-10}}
    table.measured_plan_seconds = {"alternating bfloat16": 0.012}
    table.relative_error = 0.037
    table.prediction_errors = {"half bfloat16": -0.037, "noise": 0.01}
    loaded = cost.CostTable.load(table.save(tmp_path / "costs.json"))
    assert loaded.to_dict() == table.to_dict()
    assert loaded.boundary_cost(1000, "bfloat16") == pytest.approx(2e-5 + 3e-7)
    assert "bfloat16 boundary adds 20.0 us" in loaded.summary()
    assert "whole-step prediction error +/-3.7%" in loaded.summary()
    data = table.to_dict()
    for field in (
        "boundary_seconds",
        "measured_plan_seconds",
        "relative_error",
        "prediction_errors",
    ):
        del data[field]
    old = cost.CostTable.from_dict(data)
    assert old.boundary_seconds == {} and old.boundary_cost(1000, "bfloat16") == 0.0
    assert old.relative_error == cost.DEFAULT_RELATIVE_ERROR
