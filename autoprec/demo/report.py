"""The demo's report: the verdicts, tables and host line printed from a run's figures."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..plan import PrecisionPlan
    from ..profiler import Profile

#: The policies the demo compares: the searched plan and Keras' three global policies.
POLICIES = ("float32", "plan", "mixed_bfloat16", "mixed_float16")
#: The uniform policies, each built under Keras' own global dtype policy.
UNIFORM_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
#: Step-time ratios within this fraction of 1 are a tie: the timing noise of a shared CPU.
NOISE = 0.05
#: The CPU flags that decide 16-bit speed, reported beside the timings.
_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")
#: The dtypes whose measured layer milliseconds the plan's table shows.
_MS_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """How the plan compares with one uniform policy in one run's figures.

    Attributes:
        policy: the uniform policy (`"float32"`, `"mixed_bfloat16"`, `"mixed_float16"`).
        speed: `"faster"` (the plan is faster: see `speed_relation`), `"slower"` (the
            policy is) or `"tie"`.
        median_ratio: the policy's median step over the plan's (> 1: the plan is faster).
        minimum_ratio: the policy's fastest step over the plan's.
        budget: `"within"`, `"missed"` (finite, but over the budget) or `"diverged"`.
        rounds_won: interleaved rounds in which the plan's step was the faster of the two,
            or `None` when the two were not timed in the same rounds.
        rounds: interleaved rounds both were timed in (`None` likewise).
    """

    policy: str
    speed: str
    median_ratio: float
    minimum_ratio: float
    budget: str
    rounds_won: int | None = None
    rounds: int | None = None


#: One-sided significance of the sign test over paired interleaved rounds.
SIGNIFICANCE = 0.05


def rounds_needed(rounds: int, significance: float = SIGNIFICANCE) -> int | None:
    """Returns the fewest rounds out of `rounds` one policy must win to be called faster.

    Args:
        rounds: paired rounds.
        significance: the one-sided probability allowed.

    Returns:
        The wins needed, or `None` when even winning every round is not enough (too few
        rounds: 4 or fewer at 0.05).

    Example:

    ```python
    rounds_needed(20)  # 15
    rounds_needed(3)  # None
    ```
    """
    for wins in range(rounds + 1):
        tail = sum(math.comb(rounds, k) for k in range(wins, rounds + 1)) / 2**rounds
        if tail < significance:
            return wins
    return None


def speed_relation(
    median_ratio: float,
    minimum_ratio: float,
    noise: float = NOISE,
    rounds_won: int | None = None,
    rounds: int | None = None,
) -> str:
    """Returns `"faster"`, `"slower"` or `"tie"`: what the step timings support.

    Args:
        median_ratio: the other policy's median step over the plan's.
        minimum_ratio: the other policy's fastest step over the plan's.
        noise: the fraction either side of 1 that is a tie.
        rounds_won: rounds in which the plan's step was faster, or `None` (not paired).
        rounds: paired rounds, or `None`.

    Returns:
        `"faster"`, `"slower"` or `"tie"`.

    Example:

    ```python
    speed_relation(1.30, 1.25)  # "faster"
    speed_relation(1.10, 1.01)  # "tie": the fastest steps do not support it
    speed_relation(1.30, 1.25, rounds_won=12, rounds=20)  # "tie": 12 of 20 is chance
    ```
    """
    if not (math.isfinite(median_ratio) and math.isfinite(minimum_ratio)):
        return "tie"
    needed = rounds_needed(rounds) if rounds else None
    paired = rounds_won is not None and bool(rounds)
    if median_ratio > 1 + noise and minimum_ratio > 1 + noise:
        if not paired or (needed is not None and rounds_won >= needed):
            return "faster"
    if median_ratio < 1 / (1 + noise) and minimum_ratio < 1 / (1 + noise):
        if not paired or (needed is not None and rounds - rounds_won >= needed):
            return "slower"
    return "tie"


def paired_rounds(figures: Mapping[str, Any], name: str) -> tuple[int | None, int | None]:
    """Returns `(rounds the plan won, rounds)` against policy `name`, from the step samples.

    Args:
        figures: a run's figures (`step_samples`, `timing["timed_apart"]`).
        name: a policy of `UNIFORM_POLICIES`.

    Returns:
        `(wins, rounds)`, or `(None, None)` when the two were not timed in the same rounds.

    Example:

    ```python
    won, rounds = paired_rounds(figures, "float32")  # e.g. (17, 20)
    ```
    """
    samples = figures.get("step_samples") or {}
    apart = set((figures.get("timing") or {}).get("timed_apart", ()))
    plan, other = samples.get("plan"), samples.get(name)
    if not plan or not other or len(plan) != len(other) or apart & {"plan", name}:
        return None, None
    return sum(mine < theirs for mine, theirs in zip(plan, other)), len(plan)


def budget_status(figures: Mapping[str, Any], name: str) -> str:
    """Returns `"within"`, `"missed"` or `"diverged"`: policy `name` against the run's budget.

    Args:
        figures: a run's figures (`finite`, `metrics`, `budget["threshold"]`, `mode`).
        name: a policy of `POLICIES`.

    Returns:
        `"diverged"` when its training was not finite, `"missed"` when its validation
        metric is worse than the threshold, else `"within"`.

    Example:

    ```python
    budget_status(figures, "mixed_float16")  # "diverged": raw counts overflow float16
    ```
    """
    value = figures["metrics"].get(name, math.nan)
    if not figures["finite"].get(name, False) or value is None or not math.isfinite(value):
        return "diverged"
    threshold = figures["budget"]["threshold"]
    worse = value < threshold if figures["mode"] == "max" else value > threshold
    return "missed" if worse else "within"


def compare(figures: Mapping[str, Any], noise: float = NOISE) -> dict[str, Comparison]:
    """Returns how the plan compares with each uniform policy, read from a run's figures.

    Args:
        figures: a run's figures: `step_seconds` (medians), `step_seconds_min`,
            `step_samples` and `timing` (for the paired rounds, optional), `finite`,
            `metrics`, `budget`, `mode`.
        noise: the step-time fraction that is a tie.

    Returns:
        `{policy: Comparison}` for each of `UNIFORM_POLICIES`.

    Example:

    ```python
    compare(figures)["float32"].speed  # "faster", "slower" or "tie"
    ```
    """
    median, minimum = figures["step_seconds"], figures["step_seconds_min"]
    comparisons = {}
    for name in UNIFORM_POLICIES:
        median_ratio = median[name] / median["plan"]
        minimum_ratio = minimum[name] / minimum["plan"]
        won, rounds = paired_rounds(figures, name)
        comparisons[name] = Comparison(
            policy=name,
            speed=speed_relation(median_ratio, minimum_ratio, noise, won, rounds),
            median_ratio=median_ratio,
            minimum_ratio=minimum_ratio,
            budget=budget_status(figures, name),
            rounds_won=won,
            rounds=rounds,
        )
    return comparisons


def verdicts(figures: Mapping[str, Any], noise: float = NOISE) -> list[str]:
    """Returns the sentences `run_demo` prints, each one read from the run's figures.

    Args:
        figures: as `run_demo` returns them.
        noise: the step-time fraction that is a tie.

    Returns:
        The sentences, in print order.

    Example:

    ```python
    figures = autoprec.demo.run_demo(quick=True)
    assert autoprec.demo.verdicts(figures) == figures["verdicts"]
    ```
    """
    comparisons = compare(figures, noise)
    metric = figures["metric"]
    lines = []
    if figures.get("plan_uniform_float32"):
        costs = figures.get("layer_costs", "measured")
        lines.append(f"the plan is uniform float32: no layer {costs} faster in 16-bit here.")
    for name in UNIFORM_POLICIES:
        lines.append(_policy_sentence(figures, comparisons[name], metric, noise))
    plan_budget = budget_status(figures, "plan")
    if plan_budget == "within":
        lines.append(
            f"plan: {metric} {_number(figures['metrics']['plan'])}, within the budget "
            f"({_budget_text(figures)})."
        )
    else:
        lines.append(
            f"plan: {'training diverged' if plan_budget == 'diverged' else 'misses the budget'}"
            f" in this run ({metric} {_number(figures['metrics']['plan'])}; "
            f"{_budget_text(figures)})."
        )
    lines.append(_conclusion(figures, comparisons, plan_budget, noise))
    if figures.get("predicted"):
        lines.append(_prediction_sentence(figures, comparisons, noise))
    return lines


def _policy_sentence(figures, comparison: Comparison, metric: str, noise: float) -> str:
    name = comparison.policy
    value = figures["metrics"].get(name, math.nan)
    if comparison.budget == "diverged":
        quality = "training diverged (NaN loss)"
    elif comparison.budget == "missed":
        quality = (
            f"misses the budget ({metric} {_number(value)}, allowed "
            f"{_comparator(figures)} {_number(figures['budget']['threshold'])})"
        )
    else:
        quality = f"within the budget ({metric} {_number(value)})"
    return f"{name}: {quality}; {_speed_text(comparison, noise)}."


def _speed_text(comparison: Comparison, noise: float) -> str:
    ratios = (
        f"the plan's speedup over it: {comparison.median_ratio:.2f}x median step, "
        f"{comparison.minimum_ratio:.2f}x fastest step"
    )
    if comparison.rounds:
        ratios += f", the plan faster in {comparison.rounds_won} of {comparison.rounds} rounds"
    if comparison.speed == "faster":
        return f"the plan is faster ({ratios})"
    if comparison.speed == "slower":
        return f"it is faster than the plan ({ratios})"
    needed = rounds_needed(comparison.rounds) if comparison.rounds else None
    rule = f"a difference must exceed {noise:.0%} at both the median and the fastest step"
    if comparison.rounds:
        rule += (
            f" and win at least {needed} of {comparison.rounds} rounds"
            if needed is not None
            else f", and {comparison.rounds} rounds cannot show one"
        )
    return f"same speed as the plan within noise ({rule}; {ratios})"


def _conclusion(figures, comparisons: dict[str, Comparison], plan_budget: str, noise) -> str:
    device = figures.get("device") or {}
    if device.get("kind") == "cpu" or (not device and figures.get("host")):
        where = f"on this CPU ({figures['host']['cpu']})"
    else:
        where = f"on this device ({device['name']})" if device else "here"
    eligible = [name for name in UNIFORM_POLICIES if comparisons[name].budget == "within"] or [
        "float32"
    ]
    best = min(eligible, key=lambda name: figures["step_seconds"][name])
    comparison = comparisons[best]
    if plan_budget != "within":
        return (
            f"verdict {where}: use {best}, the fastest uniform policy within budget; the plan "
            "did not keep the budget in this run (search with more steps per trial)."
        )
    if comparison.speed == "faster":
        return (
            f"verdict {where}: the plan is {comparison.median_ratio:.2f}x faster than {best} "
            f"at the median step ({comparison.minimum_ratio:.2f}x at the fastest), {best} "
            "being the fastest uniform policy within budget."
        )
    if comparison.speed == "slower":
        return (
            f"verdict {where}: {best} is {1 / comparison.median_ratio:.2f}x faster than the "
            f"plan at the median step ({1 / comparison.minimum_ratio:.2f}x at the fastest); "
            f"use {best} here."
        )
    return (
        f"verdict {where}: the plan ties {best}, the fastest uniform policy within budget "
        f"(speedup {comparison.median_ratio:.2f}x median step, {comparison.minimum_ratio:.2f}x "
        "fastest step: not a difference beyond the noise); the per-layer choice did not pay "
        "in this run."
    )


def _prediction_sentence(figures, comparisons: dict[str, Comparison], noise: float) -> str:
    predicted = figures["predicted"]
    speedups = predicted["speedup_over"]
    faster_but_broken = [
        name
        for name in ("mixed_bfloat16", "mixed_float16")
        if speedups[name] < 1 / (1 + noise) and comparisons[name].budget != "within"
    ]
    text = (
        f"predicted for {predicted['device']} at batch {predicted['batch_size']} (roofline of "
        f"its built-in profile, not measured): the plan {speedups['float32']:.2f}x float32's "
        f"speed, mixed_bfloat16 {speedups['float32'] / speedups['mixed_bfloat16']:.2f}x, "
        f"mixed_float16 {speedups['float32'] / speedups['mixed_float16']:.2f}x"
    )
    if faster_but_broken:
        text += (
            f"; {' and '.join(faster_but_broken)} predicted faster than the plan there, but "
            f"{'they' if len(faster_but_broken) > 1 else 'it'} failed the budget in this run"
        )
    return text + "."


def _budget_text(figures) -> str:
    budget = figures["budget"]
    return (
        f"{figures['metric']} {_comparator(figures)} {_number(budget['threshold'])} allowed, "
        f"float32 {_number(figures['float32_metric'])}"
    )


def _comparator(figures) -> str:
    return ">=" if figures["mode"] == "max" else "<="


def _number(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "nan"
    return f"{value:.4g}"


def layer_table(
    plan: PrecisionPlan, profile: Profile | None, costs_evidence: Mapping[str, Any]
) -> str:
    """Returns the printed table of the plan: each layer's range, float16 fit, costs and dtype."""
    headers = ("layer", "class", "max |x|", "f16 fits", "f32 ms", "bf16 ms", "chosen")
    rows = []
    for path, dtype in plan.layers.items():
        info = plan.layer_info.get(path)
        layer_profile = profile.layers.get(path) if profile is not None else None
        seconds = costs_evidence.get(path, {}).get("seconds", {})
        activation = layer_profile.activation if layer_profile is not None else None
        rows.append(
            (
                path,
                info.class_name if info else "?",
                f"{activation.max_abs:.3g}" if activation is not None else "-",
                "-" if layer_profile is None else "yes" if layer_profile.float16_safe else "NO",
                *(
                    "-" if seconds.get(key) is None else f"{seconds[key] * 1e3:.2f}"
                    for key in _MS_DTYPES
                ),
                dtype,
            )
        )
    return _table(headers, rows)


def _table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(row[i])) for row in (headers, *rows)) for i in range(len(headers))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(headers, widths))]
    lines.append("  ".join("-" * width for width in widths))
    lines += ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def results_table(figures: Mapping[str, Any]) -> str:
    """Returns the printed table: each policy's metric, budget, loss, steps and prediction.

    Args:
        figures: as `run_demo` returns them.

    Returns:
        The table's text, one row per policy of `POLICIES`.

    Example:

    ```python
    print(results_table(autoprec.demo.run_demo(quick=True)))
    ```
    """
    predicted = figures.get("predicted")
    headers = ["policy", figures["metric"], "budget", "final loss", "step ms min", "median"]
    headers += ["median vs plan", "plan faster in"]
    if predicted:
        headers.append(f"{predicted['hardware']} pred. ms (batch {predicted['batch_size']})")
    rows = []
    for name in POLICIES:
        status = budget_status(figures, name)
        row = [
            name,
            _number(figures["metrics"][name]) if status != "diverged" else "diverged",
            {"within": "ok", "missed": "MISSED", "diverged": "MISSED"}[status],
            _number(figures["losses"][name]),
            f"{figures['step_seconds_min'][name] * 1e3:.1f}",
            f"{figures['step_seconds'][name] * 1e3:.1f}",
            "-" if name == "plan" else f"{figures['speedup_over'][name]:.2f}x",
            _rounds_text(figures, name),
        ]
        if predicted:
            row.append(f"{predicted['step_seconds'][name] * 1e3:.3f}")
        rows.append(tuple(row))
    return _table(tuple(headers), rows)


def _rounds_text(figures: Mapping[str, Any], name: str) -> str:
    if name == "plan":
        return "-"
    won, rounds = paired_rounds(figures, name)
    return "timed apart" if rounds is None else f"{won}/{rounds} rounds"


def host_text(host: Mapping[str, Any]) -> str:
    """Returns the host line printed beside the timings, e.g. `"AMD EPYC, 2 cores, avx512_bf16"`.

    Args:
        host: as `describe_host` returns it.

    Returns:
        The CPU model, its cores and the 16-bit flags it has (`"no 16-bit flags"` if none).

    Example:

    ```python
    host_text({"cpu": "CPU", "cores": 1, "flags": {}})  # "CPU, 1 cores, no 16-bit flags"
    ```
    """
    flags = [flag for flag in _CPU_FLAGS if host.get("flags", {}).get(flag)]
    missing = [flag for flag in _CPU_FLAGS if flag not in flags]
    flag_text = ", ".join(flags) if flags else "no 16-bit flags"
    if flags and missing:
        flag_text += f" (no {', '.join(missing)})"
    return f"{host.get('cpu', 'CPU')}, {host.get('cores', '?')} cores, {flag_text}"
