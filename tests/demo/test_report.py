"""`autoprec.demo`: the verdicts, tables and host line read from a run's figures.

The logic that turns figures into sentences is checked with hand-made figures: every
relation the sentences may claim. The real quick run, whose printed sentences must be
the ones its own figures give, is in test_run.py.
"""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace

import pytest

from autoprec import demo as report

# ---------------------------------------------------------------------- hand-made figures


#: The load of a shared CPU, in every policy's step of one round alike: paired rounds cancel it.
DRIFT = [0.0, 0.03, -0.02, 0.05, 0.01] * 4


def figures(
    steps: dict[str, float | list[float]],
    metrics: dict[str, float] | None = None,
    predicted: dict[str, float] | None = None,
    timed_apart: tuple[str, ...] = (),
) -> dict:
    """Figures as `run_demo` returns them, from step milliseconds (a list: one per round; a
    number: twenty rounds of it under `DRIFT`) and validation losses."""
    samples = {
        name: list(value) if isinstance(value, list) else [value * (1 + d) for d in DRIFT]
        for name, value in steps.items()
    }
    median = {name: statistics.median(values) for name, values in samples.items()}
    metrics = metrics or {"float32": 0.40, "plan": 0.42, "mixed_bfloat16": 1.7}
    metrics = {"mixed_float16": math.nan, **metrics}
    reference = metrics["float32"]
    result = {
        "metric": "val_loss",
        "mode": "min",
        "float32_metric": reference,
        "plan_metric": metrics["plan"],
        "metrics": metrics,
        "finite": {name: math.isfinite(value) for name, value in metrics.items()},
        "losses": dict(metrics),
        "budget": {"metric": "val_loss", "max_relative_drop": 0.5, "threshold": 1.5 * reference},
        "step_seconds": {name: value / 1e3 for name, value in median.items()},
        "step_seconds_min": {name: min(values) / 1e3 for name, values in samples.items()},
        "step_samples": {name: [v / 1e3 for v in values] for name, values in samples.items()},
        "timing": {"rounds": len(samples["plan"]), "timed_apart": list(timed_apart)},
        "speedup_over": {n: median[n] / median["plan"] for n in median if n != "plan"},
        "plan_uniform_float32": False,
        "host": {"cpu": "Test CPU", "cores": 2, "flags": {"avx512_bf16": True}},
        "device": {"name": "Test CPU", "kind": "cpu"},
        "predicted": None,
    }
    if predicted:
        result["predicted"] = {
            "hardware": "rtx4090",
            "device": "NVIDIA GeForce RTX 4090",
            "batch_size": 1024,
            "step_seconds": predicted,
            "speedup_over": {n: predicted[n] / predicted["plan"] for n in predicted if n != "plan"},
        }
    return result


def line_of(lines: list[str], start: str) -> str:
    (found,) = [line for line in lines if line.startswith(start)]
    return found


STEPS = {"float32": 30.0, "plan": 20.0, "mixed_bfloat16": 19.6, "mixed_float16": 300.0}


def test_rounds_needed_is_a_one_sided_sign_test_at_five_percent():
    assert report.rounds_needed(20) == 15  # P(>= 15 of 20) = 0.021, P(>= 14) = 0.058
    assert report.rounds_needed(5) == 5  # 1/32
    assert report.rounds_needed(4) is None  # 1/16: four rounds cannot show a difference
    assert report.rounds_needed(3) is None


def paired_figures(plan_ms: list[float], float32_ms: list[float]) -> dict:
    """Figures whose plan and float32 steps were timed in the same interleaved rounds."""
    samples = {
        "plan": plan_ms,
        "float32": float32_ms,
        "mixed_bfloat16": [value * 0.99 for value in plan_ms],
        "mixed_float16": [300.0, 310.0, 305.0],
    }
    return figures(samples, timed_apart=("mixed_float16",))


def test_verdicts_need_the_plan_to_win_enough_interleaved_rounds():
    # float32's median and fastest step are 1.3x and 1.25x the plan's, yet it won 8 of 20
    # rounds: the load drifted, and the paired rounds say so.
    plan, float32 = [20.0] * 12 + [30.0] * 8, [26.0] * 12 + [25.0] * 8
    lines = report.verdicts(paired_figures(plan, float32))
    sentence = line_of(lines, "float32:")
    assert "same speed as the plan within noise" in sentence
    assert "win at least 15 of 20 rounds" in sentence
    assert "the plan faster in 12 of 20 rounds" in sentence
    assert "the plan ties float32" in line_of(lines, "verdict")

    plan, float32 = [20.0] * 17 + [30.0] * 3, [26.0] * 17 + [25.0] * 3
    lines = report.verdicts(paired_figures(plan, float32))
    assert "the plan is faster" in line_of(lines, "float32:")
    assert "the plan faster in 17 of 20 rounds" in line_of(lines, "float32:")
    assert "the plan is 1.30x faster than float32" in line_of(lines, "verdict")
    # A policy timed apart is not paired: its sentence reads the ratios alone.
    assert "rounds" not in line_of(lines, "mixed_float16:")


def test_three_rounds_cannot_show_a_difference():
    lines = report.verdicts(paired_figures([20.0, 20.5, 21.0], [40.0, 41.0, 42.0]))
    assert "3 rounds cannot show one" in line_of(lines, "float32:")
    assert "the plan ties float32" in line_of(lines, "verdict")


def test_verdicts_plan_faster_than_float32_while_each_16bit_policy_loses_something():
    lines = report.verdicts(figures(STEPS))

    assert line_of(lines, "float32:").startswith("float32: within the budget (val_loss 0.4);")
    assert "the plan is faster" in line_of(lines, "float32:")
    assert "1.50x median step" in line_of(lines, "float32:")
    bfloat16 = line_of(lines, "mixed_bfloat16:")
    assert "misses the budget (val_loss 1.7, allowed <= 0.6)" in bfloat16
    assert "same speed as the plan within noise" in bfloat16  # 0.98x: a tie
    float16 = line_of(lines, "mixed_float16:")
    assert "training diverged" in float16 and "the plan is faster" in float16
    assert "within the budget" in line_of(lines, "plan:")
    assert line_of(lines, "verdict") == (
        "verdict on this CPU (Test CPU): the plan is 1.50x faster than float32 at the median "
        "step (1.50x at the fastest), float32 being the fastest uniform policy within budget."
    )


def test_verdicts_say_the_plan_ties_float32_within_noise():
    steps = {**STEPS, "float32": 20.6}  # 1.03x: noise
    lines = report.verdicts(figures(steps))

    verdict = line_of(lines, "verdict")
    assert verdict.startswith("verdict on this CPU (Test CPU): the plan ties float32")
    assert "did not pay in this run" in verdict
    assert "same speed as the plan within noise" in line_of(lines, "float32:")
    assert "is faster" not in line_of(lines, "float32:")
    assert not any("the plan is" in line and "faster than float32" in line for line in lines)


def test_verdicts_tie_when_every_round_won_is_won_by_less_than_the_noise():
    plan = [20.0 * (1 + d) for d in DRIFT]
    lines = report.verdicts(figures({**STEPS, "plan": plan, "float32": [v * 1.04 for v in plan]}))

    sentence = line_of(lines, "float32:")
    assert "same speed as the plan within noise" in sentence
    assert "must exceed the rounds' noise and 5% of the faster step" in sentence
    assert "the plan faster in 20 of 20 rounds" in sentence
    assert "the plan ties float32" in line_of(lines, "verdict")


def test_verdicts_say_float32_is_faster_when_the_figures_show_it():
    steps = {**STEPS, "float32": 18.0}
    lines = report.verdicts(figures(steps))

    assert "it is faster than the plan" in line_of(lines, "float32:")
    assert line_of(lines, "verdict") == (
        "verdict on this CPU (Test CPU): float32 is 1.11x faster than the plan at the median "
        "step (1.11x at the fastest); use float32 here."
    )


def test_verdicts_compare_with_the_fastest_uniform_policy_within_budget():
    metrics = {"float32": 0.40, "plan": 0.42, "mixed_bfloat16": 0.45}  # within budget
    steps = {**STEPS, "mixed_bfloat16": 15.0}
    lines = report.verdicts(figures(steps, metrics=metrics))

    assert "within the budget" in line_of(lines, "mixed_bfloat16:")
    assert "mixed_bfloat16 is 1.33x faster than the plan" in line_of(lines, "verdict")


def test_verdicts_report_a_plan_over_budget_and_recommend_a_uniform_policy():
    metrics = {"float32": 0.40, "plan": 0.9, "mixed_bfloat16": 1.7}
    lines = report.verdicts(figures(STEPS, metrics=metrics))

    assert line_of(lines, "plan:").startswith("plan: misses the budget in this run")
    verdict = line_of(lines, "verdict")
    assert "use float32" in verdict and "did not keep the budget" in verdict
    assert "the plan is" not in verdict


def test_verdicts_read_the_card_prediction_and_name_broken_faster_policies():
    predicted = {"float32": 0.9e-3, "plan": 0.75e-3, "mixed_bfloat16": 0.6e-3}
    predicted["mixed_float16"] = 0.6e-3
    lines = report.verdicts(figures(STEPS, predicted=predicted))

    prediction = line_of(lines, "predicted for NVIDIA GeForce RTX 4090 at batch 1024")
    assert "not measured" in prediction
    assert "the plan 1.20x float32's speed, mixed_bfloat16 1.50x, mixed_float16 1.50x" in (
        prediction
    )
    assert "mixed_bfloat16 and mixed_float16 predicted faster than the plan there" in prediction


def test_a_uniform_float32_plan_is_said_so_with_the_costs_source():
    result = {**figures({**STEPS, "float32": 20.0}), "plan_uniform_float32": True}
    result["layer_costs"] = "predicted"
    lines = report.verdicts(result)

    assert lines[0] == "the plan is uniform float32: no layer predicted faster in 16-bit here."
    assert "the plan ties float32" in line_of(lines, "verdict")


def test_host_text_names_the_cpu_and_its_16bit_flags():
    host = {"cpu": "Intel(R) Xeon(R)", "cores": 2, "flags": {"avx512_fp16": True, "amx_bf16": True}}
    assert report.host_text(host) == (
        "Intel(R) Xeon(R), 2 cores, amx_bf16, avx512_fp16 (no avx512_bf16, amx_fp16)"
    )
    assert report.host_text({"cpu": "CPU", "cores": 1, "flags": {}}) == (
        "CPU, 1 cores, no 16-bit flags"
    )


def test_budget_status_and_compare_read_the_figures():
    result = figures(STEPS)
    assert [report.budget_status(result, name) for name in report.POLICIES] == [
        "within",
        "within",
        "missed",
        "diverged",
    ]
    comparisons = report.compare(result)
    assert set(comparisons) == set(report.UNIFORM_POLICIES)
    assert comparisons["float32"] == report.Comparison(
        policy="float32",
        speed="faster",
        median_ratio=pytest.approx(1.5),
        minimum_ratio=pytest.approx(1.5),
        budget="within",
        rounds_won=20,
        rounds=20,
    )
    assert comparisons["mixed_float16"].speed == "faster"  # 15x slower in every round
    assert comparisons["mixed_bfloat16"].speed == "tie"  # 2 % faster: under the 5 % noise


def test_compare_counts_the_plan_wins_and_skip_policies_timed_apart():
    result = paired_figures([20.0, 20.0, 30.0], [25.0, 26.0, 25.0])
    comparisons = report.compare(result)
    assert (comparisons["float32"].rounds_won, comparisons["float32"].rounds) == (2, 3)
    assert comparisons["mixed_float16"].rounds is None  # timed apart
    # Timed apart, a policy is judged on its samples alone: no sign test, no rounds figure.
    apart = figures({**STEPS, "float32": [30.0, 31.0, 29.0]}, timed_apart=("float32",))
    assert report.compare(apart)["float32"].rounds_won is None
    assert report.compare(apart)["float32"].speed == "faster"
    assert report.compare(figures(STEPS, timed_apart=("plan",)))["float32"].rounds is None


def test_results_table_has_a_row_per_policy_with_its_budget_and_prediction():
    predicted = {"float32": 0.9e-3, "plan": 0.75e-3, "mixed_bfloat16": 0.6e-3}
    predicted["mixed_float16"] = 0.6e-3
    table = report.results_table(figures(STEPS, predicted=predicted)).splitlines()

    assert table[0].split()[:3] == ["policy", "val_loss", "budget"]
    assert "rtx4090 pred. ms (batch 1024)" in table[0]
    assert [row.split()[0] for row in table[2:]] == list(report.POLICIES)
    assert table[2].split()[1:3] == ["0.4", "ok"] and "1.50x" in table[2]
    assert table[4].split()[1:3] == ["1.7", "MISSED"]
    assert table[5].split()[1:3] == ["diverged", "MISSED"]
    assert table[3].split()[-1] == "0.750"  # the plan's predicted milliseconds


def test_layer_table_shows_each_layers_range_fit_costs_and_dtype():
    plan = SimpleNamespace(
        layers={"proj": "float32", "wide": "bfloat16"},
        layer_info={"proj": SimpleNamespace(class_name="Dense")},
    )
    profile = SimpleNamespace(
        layers={
            "proj": SimpleNamespace(activation=SimpleNamespace(max_abs=1.87e5), float16_safe=False)
        }
    )
    evidence = {"wide": {"seconds": {"float32": 2.78e-3, "bfloat16": 1.5e-3}}}
    lines = report.layer_table(plan, profile, evidence).splitlines()

    assert lines[0].split() == ["layer", "class", "max", "|x|", "f16", "fits", "f32", "ms"] + [
        "bf16",
        "ms",
        "chosen",
    ]
    assert lines[2].split() == ["proj", "Dense", "1.87e+05", "NO", "-", "-", "float32"]
    assert lines[3].split() == ["wide", "?", "-", "-", "2.78", "1.50", "bfloat16"]
    assert report.layer_table(plan, None, {}).splitlines()[2].split()[2:4] == ["-", "-"]
