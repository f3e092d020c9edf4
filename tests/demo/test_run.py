"""`autoprec.demo.run_demo`: the built-in end-to-end run, as a function and as a command.

One real quick run, whose printed sentences must be the ones its own figures JSON
gives; the sentences themselves are checked with hand-made figures in test_report.py.
"""

from __future__ import annotations

import json
import math
import re
import statistics

import keras
import numpy as np
import pytest

import autoprec
from autoprec import cli, demo


def line_of(lines: list[str], start: str) -> str:
    (found,) = [line for line in lines if line.startswith(start)]
    return found


def test_describe_host_reports_every_16bit_flag():
    assert set(demo.describe_host()["flags"]) == {
        "avx512_bf16",
        "amx_bf16",
        "avx512_fp16",
        "amx_fp16",
    }


def test_keras_global_policy_builds_under_it_and_restores_the_previous_one():
    with demo.keras_global_policy("mixed_bfloat16"):
        assert keras.config.dtype_policy().name == "mixed_bfloat16"
        layer = keras.layers.Dense(2)
    assert layer.dtype_policy.name == "mixed_bfloat16"
    assert keras.config.dtype_policy().name == "float32"
    with pytest.raises(RuntimeError), demo.keras_global_policy("mixed_float16"):
        raise RuntimeError("restored even on an error")
    assert keras.config.dtype_policy().name == "float32"


# ---------------------------------------------------------------------- real runs


def test_run_demo_quick_prints_the_verdicts_its_figures_support(tmp_path, capsys):
    output = tmp_path / "plan.json"
    figures_path = tmp_path / "figures.json"
    result = demo.run_demo(output=str(output), quick=True, n_trials=1, figures_path=figures_path)
    printed = capsys.readouterr().out

    plan = autoprec.PrecisionPlan.load(output)
    assert set(plan.layers) >= {"sensor_proj", "smooth", "wide_1", "wide_3", "narrow", "head"}
    assert plan.layers["sensor_proj"] != "float16"
    assert math.isfinite(result["float32_metric"]) and math.isfinite(result["plan_metric"])
    assert result["finite"]["plan"]
    assert not result["finite"]["mixed_float16"]  # raw counts overflow float16
    assert set(result["speedup_over"]) == {"float32", "mixed_bfloat16", "mixed_float16"}
    assert str(output) in printed

    saved = json.loads(figures_path.read_text())
    for key in ("metric", "float32_metric", "plan_metric", "metrics", "finite", "step_seconds"):
        assert key in saved
    for key in ("speedup_over", "plan_path", "trials", "wall_seconds", "host", "predicted"):
        assert key in saved
    assert saved["metrics"]["mixed_float16"] is None  # NaN is written as null
    # The timings the sentences read are the samples' own minimum and median.
    for name, samples in saved["step_samples"].items():
        assert saved["step_seconds"][name] == pytest.approx(statistics.median(samples))
        assert saved["step_seconds_min"][name] == pytest.approx(min(samples))
    # Every printed sentence is the one the saved figures give, and each claim holds.
    assert demo.verdicts(saved) == saved["verdicts"] == result["verdicts"]
    for line in saved["verdicts"]:
        assert "  " + line in printed
    # Each claim holds on the rounds: the median round difference beyond 5 % of the faster step,
    # and the rounds won enough for a sign test where the two were timed in the same rounds.
    apart, samples = saved["timing"]["timed_apart"], saved["step_samples"]
    for name, comparison in demo.compare(saved).items():
        median = saved["step_seconds"][name] / saved["step_seconds"]["plan"]
        fastest = saved["step_seconds_min"][name] / saved["step_seconds_min"]["plan"]
        count = min(len(samples["plan"]), len(samples[name]))
        plan, other = np.asarray(samples["plan"][:count]), np.asarray(samples[name][:count])
        won, needed = int(np.sum(plan < other)), demo.rounds_needed(count) or math.inf
        paired = name not in apart and "plan" not in apart
        expected = (won, count) if paired else (None, None)
        assert (comparison.rounds_won, comparison.rounds) == expected
        sentence = line_of(saved["verdicts"], f"{name}:")
        if comparison.speed == "faster":
            assert np.median(other - plan) > 0.05 * np.median(plan)
            assert not paired or won >= needed
            assert "the plan is faster" in sentence
        elif comparison.speed == "slower":
            assert np.median(plan - other) > 0.05 * np.median(other)
            assert not paired or count - won >= needed
            assert "it is faster than the plan" in sentence
        else:
            assert "same speed as the plan within noise" in sentence
        assert f"{median:.2f}x median step, {fastest:.2f}x fastest step" in sentence
    # The host and the card prediction are printed beside the timings.
    assert f"host: {demo.host_text(saved['host'])}" in printed
    assert saved["predicted"]["hardware"] == "rtx4090"
    assert "rtx4090 pred. ms" in printed
    assert re.search(r"verdict on this CPU \(.+\): ", printed)


def test_cli_demo_quick_exits_zero(tmp_path):
    output = tmp_path / "cli_plan.json"
    assert cli.main(["demo", "--quick", "--n-trials", "1", "-o", str(output)]) == 0
    assert autoprec.PrecisionPlan.load(output).layers
