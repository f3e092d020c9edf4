"""The one-liner benchmark's summary and printing (`bench/oneliner.py`): tables, verdicts, goal."""

from __future__ import annotations

import json
from typing import Any

from common.timing import STATISTICS, geometric_mean

PLANS = ("one-liner", "search")
MIN_BOUND = 1.03  # the goal on the minimum: at most 1.03x of the best uniform policy


def summarise(rows: dict[str, dict]) -> dict[str, Any]:
    """Geometric means of each plan's ratios, over all models and where 16-bit pays; the goal."""
    summary: dict[str, Any] = {"geomean": {}, "geomean_where_16bit_pays": {}}
    paying = [name for name, row in rows.items() if row.get("sixteen_bit_pays")]
    for plan in PLANS:
        for key, names in (("geomean", list(rows)), ("geomean_where_16bit_pays", paying)):
            summary[key][plan] = {
                statistic: geometric_mean(
                    [
                        rows[name]["ratios"][plan][statistic]
                        for name in names
                        if plan in rows[name].get("ratios", {})
                    ]
                )
                for statistic in STATISTICS
            }
    summary["models_where_16bit_pays"] = paying
    goal = {}
    for plan in PLANS:
        verdicts = [row.get("verdicts", {}).get(plan, "ERROR") for row in rows.values()]
        if all(verdict == "n/a" for verdict in verdicts):
            continue
        mean = summary["geomean_where_16bit_pays"][plan]["min"]
        goal[plan] = {
            "models_pass": all(verdict == "PASS" for verdict in verdicts),
            "geomean_below_1": None if not paying or mean is None else mean < 1.0,
        }
        goal[plan]["pass"] = (
            goal[plan]["models_pass"] and goal[plan]["geomean_below_1"] is not False
        )
    summary["goal"] = goal
    return summary


def short(value: Any, width: int = 160) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= width else text[: width - 3] + "..."


def print_model(name: str, row: dict[str, Any]) -> None:
    print(
        f"\n== {name}: {row['kind']}, {row.get('parameters', 0):,} parameters, batch {row['batch_size']}"
    )
    if row.get("candidates"):
        print(f"  {'candidate':<15} {'ms min':>8} {'median':>8}   {'/ best uniform min, median'}")
    for candidate, figures in row.get("candidates", {}).items():
        ratio = row["ratios"].get(candidate)
        text = f"  {candidate:<15} {figures['ms_min']:8.1f} {figures['ms_median']:8.1f}"
        if ratio:
            text += f"   {ratio['min']:6.3f}x {ratio['median']:6.3f}x"
        print(text)
    if "best_uniform" in row:
        best = row["best_uniform"]
        print(
            f"  best uniform: {best['min']} (min), {best['median']} (median); "
            f"16-bit pays here: {'yes' if row['sixteen_bit_pays'] else 'no'}"
        )
    for plan, info in row.get("plans", {}).items():
        print(
            f"  {plan} plan: "
            + ", ".join(f"{count} {dtype}" for dtype, count in info["composition"].items())
        )
        for key, value in info["report"].items():
            if isinstance(value, dict) and len(short(value)) > 120:
                for inner, item in value.items():
                    if "rounds" not in inner:  # the per-round figures stay in the JSON
                        print(f"    {key}.{inner}: {short(item)}")
            else:
                print(f"    {key}: {short(value)}")
    if row.get("one_liner_messages"):
        print("  what the one-liner showed (verbose=1):")
    for line in row.get("one_liner_messages", []):
        print(f"    | {line}")
    if "one_liner_added_s" in row:
        print(
            f"  one-liner added {row['one_liner_added_s']:.1f} s to the first epoch "
            f"({row['fit_autoprecision_s']:.1f} s with AutoPrecision, {row['fit_plain_s']:.1f} s without)"
        )
    if "search_s" in row:
        print(f"  search: {row['search_s']:.1f} s")
    for candidate, error in row.get("errors", {}).items():
        print(f"  ERROR {candidate}: {short(error, 400)}")
    for plan, verdict in row.get("verdicts", {}).items():
        ratio = row.get("ratios", {}).get(plan)
        figures = f" ({ratio['min']:.3f}x min, {ratio['median']:.3f}x median)" if ratio else ""
        print(f"  {verdict} {plan}{figures}")
    stages = ", ".join(
        f"{stage} {seconds:.0f}" for stage, seconds in row.get("stage_s", {}).items()
    )
    print(f"  ({row.get('wall_s', 0):.0f} s: {stages})")


def print_summary(rows: dict[str, dict], summary: dict[str, Any]) -> None:
    print("\n== summary: ratio to the best uniform policy, min / median over rounds")
    print(f"  {'model':<12} {'one-liner':>17} {'search':>17}  16-bit pays  verdicts")
    for name, row in rows.items():
        cells = []
        for plan in PLANS:
            ratio = row.get("ratios", {}).get(plan)
            cells.append(f"{ratio['min']:.3f}/{ratio['median']:.3f}" if ratio else "-")
        verdicts = " ".join(
            f"{plan}:{verdict}" for plan, verdict in row.get("verdicts", {}).items()
        )
        pays = "yes" if row.get("sixteen_bit_pays") else "no"
        print(f"  {name:<12} {cells[0]:>17} {cells[1]:>17}  {pays:<11}  {verdicts}")
    for key, label in (
        ("geomean", "all models"),
        ("geomean_where_16bit_pays", "where 16-bit pays"),
    ):
        cells = []
        for plan in PLANS:
            mean = summary[key][plan]
            cells.append("-" if mean["min"] is None else f"{mean['min']:.3f}/{mean['median']:.3f}")
        print(f"  {'geomean':<12} {cells[0]:>17} {cells[1]:>17}  ({label})")
    print(
        f"  goal: every model at most {MIN_BOUND:.2f}x on the minimum; geometric mean (min) below "
        "1.00x over the models where 16-bit pays (a uniform 16-bit policy >5 % faster than float32)"
    )
    for plan, goal in summary["goal"].items():
        mean = summary["geomean_where_16bit_pays"][plan]["min"]
        below = (
            "n/a (16-bit pays on no model)"
            if goal["geomean_below_1"] is None
            else (f"{mean:.3f}x {'<' if goal['geomean_below_1'] else '>='} 1.00")
        )
        print(
            f"  {'PASS' if goal['pass'] else 'FAIL'} {plan}: models "
            f"{'all pass' if goal['models_pass'] else 'not all pass'}; geomean where 16-bit pays {below}"
        )
