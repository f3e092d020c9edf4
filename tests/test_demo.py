"""`autoprec demo`: the built-in end-to-end run, as a function and as a command."""

from __future__ import annotations

import math

import autoprec
from autoprec import cli, demo


def test_run_demo_quick_writes_a_plan_and_returns_figures(tmp_path, capsys):
    output = tmp_path / "plan.json"
    figures = demo.run_demo(output=str(output), quick=True, n_trials=2)

    plan = autoprec.PrecisionPlan.load(output)
    assert set(plan.layers) >= {"sensor_proj", "wide_1", "wide_2", "narrow", "head"}
    assert math.isfinite(figures["float32_metric"])
    assert math.isfinite(figures["plan_metric"])
    assert figures["finite"]["plan"]
    assert not figures["finite"]["mixed_float16"]  # sensor_proj overflows float16
    assert plan.layers["sensor_proj"] != "float16"
    assert set(figures["speedup_over"]) == {"float32", "mixed_bfloat16", "mixed_float16"}
    assert all(value > 0 for value in figures["speedup_over"].values())
    printed = capsys.readouterr().out
    assert "mixed_float16" in printed and "diverged" in printed
    assert str(output) in printed


def test_cli_demo_quick_exits_zero(tmp_path):
    output = tmp_path / "cli_plan.json"
    assert cli.main(["demo", "--quick", "--n-trials", "1", "-o", str(output)]) == 0
    assert autoprec.PrecisionPlan.load(output).layers
