"""The float8 benchmark's judgement, goals and printing (`bench/fp8.py`): budgets held, checks, tables."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fp8_models import CARDS, GOAL_CARD, SPEEDUP_GOAL, UNIFORM, budget


def judge(row: dict[str, Any]) -> None:
    """Adds each plan's speedups over bfloat16, whether it holds the budget, and the checks."""
    plans = row["plans"]
    limits = {
        steps: budget().threshold(loss) for steps, loss in plans["float32"]["val_loss_at"].items()
    }
    row["budget_limit_at"] = limits
    row["budget_limit"] = limits[max(limits)] if limits else None
    for figures in plans.values():
        figures["holds_at"] = {
            steps: bool(loss <= limits[steps]) for steps, loss in figures["val_loss_at"].items()
        }
        at_end = figures["holds_at"]
        figures["holds"] = at_end[max(at_end)] if at_end else None
        figures["speedup_vs_bfloat16"] = {
            card: plans["bfloat16"]["predicted_ms"][card] / ms if ms and math.isfinite(ms) else 0.0
            for card, ms in figures["predicted_ms"].items()
        }
    row["best_uniform"] = {}
    for card in CARDS:
        holding = [name for name in UNIFORM if plans[name]["holds"]]
        row["best_uniform"][card] = (
            min(holding, key=lambda name: plans[name]["predicted_ms"][card]) if holding else None
        )
    row["not_slower_checks"] = [
        not_slower_check(plans, name, row["best_uniform"])
        for name in plans
        if name.partition(" ")[0] in ("search", "heuristic")
    ]


def not_slower_check(
    plans: Mapping[str, Any], name: str, best_uniform: Mapping[str, str | None]
) -> dict[str, Any]:
    """The second goal for one plan, on the card it was made for."""
    card = name.partition(" ")[2]
    best = best_uniform[card]
    check: dict[str, Any] = {"plan": name, "card": card, "best_uniform": best}
    check["holds"] = plans[name]["holds"]
    if best is None:
        return {**check, "ratio": None, "pass": False}
    ratio = plans[name]["predicted_ms"][card] / plans[best]["predicted_ms"][card]
    return {**check, "ratio": ratio, "pass": bool(ratio <= 1.0 + 1e-9)}


def goals(rows: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """The two goals over every model's row, with the figures they were judged on."""
    result: dict[str, Any] = {}
    gpt = rows.get("gpt")
    if gpt is not None and "plans" in gpt:
        candidates = []
        for name in (f"search {GOAL_CARD}", f"heuristic {GOAL_CARD}", "float8 wherever"):
            figures = gpt["plans"].get(name)
            if figures is not None:
                speedup = figures["speedup_vs_bfloat16"][GOAL_CARD]
                candidates.append({"plan": name, "speedup": speedup, "holds": figures["holds"]})
        passing = [
            item
            for item in candidates
            if item["plan"] != "float8 wherever"
            and item["holds"]
            and item["speedup"] >= SPEEDUP_GOAL
        ]
        result["gpt_speedup"] = {"candidates": candidates, "pass": bool(passing)}
    checks = [
        {"model": name, **check}
        for name, row in rows.items()
        for check in row.get("not_slower_checks", [])
    ]
    result["not_slower"] = {
        "checks": checks,
        "pass": bool(checks) and all(check["pass"] for check in checks),
        **{
            f"{kind}_pass": all(check["pass"] for check in checks if check["plan"].startswith(kind))
            for kind in ("search", "heuristic")
        },
    }
    return result


def cell(ms: float, speedup: float) -> str:
    """`  30.01 1.27x` (predicted ms and speedup over bfloat16), or `infeasible`."""
    if not math.isfinite(ms):
        return f"{'infeasible':>14}"
    return f"{ms:8.2f} {speedup:5.2f}x"


def print_model(name: str, row: dict[str, Any]) -> None:
    """The model's table (plans x cards), its plans, search, CPU timing and checks."""
    print(f"\n== {name}: {row['kind']}, {row.get('parameters', 0):,} parameters")
    print(
        f"  predicted at {row['predicted_shapes']}; trained here at {row['trained_shapes']} "
        "(same model, shorter inputs)"
    )
    plans = row.get("plans", {})
    if plans:
        print_table(plans, row.get("budget_limit_at", {}))
        print_plans(plans)
    for card, lines in row.get("heuristic_messages", {}).items():
        for line in lines:
            if "predicted step" in line or "no float8" in line:
                print(f"  | heuristic {card}: {line.removeprefix('autoprec.heuristic: ')}")
    for card, record in row.get("search", {}).items():
        print_search(card, record, plans.get(f"search {card}"))
    print_cpu_timing(row.get("cpu_step_ms"))
    for check in row.get("not_slower_checks", []):
        print_not_slower(name, check, plans)
    for what, error in row.get("errors", {}).items():
        print(f"  ERROR {what}: {error[:600]}")
    searches = ", ".join(f"{card} {seconds:.0f} s" for card, seconds in row["search_s"].items())
    stages = ", ".join(f"{stage} {seconds:.0f}" for stage, seconds in row["stage_s"].items())
    print(f"  search: {searches or 'none'}; ({row['wall_s']:.0f} s: {stages})")


def print_table(plans: Mapping[str, Any], limits: Mapping[int, float]) -> None:
    """Rows = plans; predicted ms and speedup over bfloat16 per card, val_loss, budget held."""
    checkpoints = sorted(limits)
    header = "".join(f" {card + ' ms':>8} {'/bf16':>6}" for card in CARDS)
    losses = "".join(f" {'loss@' + str(steps):>9}" for steps in checkpoints)
    steps_text = "/".join(f"@{steps}" for steps in checkpoints)
    print(f"  {'plan':<18}{header}{losses}  holds budget {steps_text}")
    for plan, figures in plans.items():
        cells = "".join(
            " " + cell(figures["predicted_ms"][card], figures["speedup_vs_bfloat16"][card])
            for card in CARDS
        )
        loss_at, holds_at = figures.get("val_loss_at", {}), figures.get("holds_at", {})
        losses = "".join(
            f" {loss_at[steps]:9.4f}" if steps in loss_at else f" {'-':>9}" for steps in checkpoints
        )
        holds = (
            "/".join("yes" if holds_at[steps] else "NO" for steps in checkpoints)
            if holds_at
            else "- (predicted only)"
        )
        same = f" (= {figures['same_as']})" if "same_as" in figures else ""
        print(f"  {plan:<18}{cells}{losses}  {holds}{same}")
    limits_text = ", ".join(f"{limits[steps]:.4f} @{steps}" for steps in checkpoints)
    if limits:
        print(
            f"  budget: val_loss at most float32's + 2 % ({limits_text} steps); a plan holds it "
            f"when it does @{checkpoints[-1]}"
        )


def print_plans(plans: Mapping[str, Any]) -> None:
    """The heuristic's and the search's plans: dtypes, float32 layers, float8 layers left out."""
    for plan, figures in plans.items():
        if not plan.startswith(("heuristic", "search")) or "same_as" in figures:
            continue
        parts = ", ".join(f"{count} {dtype}" for dtype, count in figures["composition"].items())
        print(f"  {plan} plan: {parts}")
        if figures["float32_layers"]:
            print(f"    float32: {', '.join(figures['float32_layers'])}")
        outside = [
            path
            for path in plans["float8 wherever"]["float8_layers"]
            if path not in figures["float8_layers"]
        ]
        if outside:
            print(f"    not float8 (float8 in 'float8 wherever'): {', '.join(outside)}")


def print_search(card: str, record: Mapping[str, Any], returned: Mapping[str, Any] | None) -> None:
    """The search's trials within budget (fastest first) and a note if it returned a slower plan."""
    points = record["within_budget"]
    tried = "; ".join(f"{point['label']} {point['predicted_ms']:.2f} ms" for point in points)
    print(
        f"  search {card}: {record['trials']} trials, float32 reference val_loss "
        f"{record['reference_metric']:.4f}; within budget in its own trials: {tried or 'none'}"
    )
    missed = "; ".join(
        f"{point['label']} {point['predicted_ms']:.2f} ms (val_loss {point['metric']:.4f})"
        if point["metric"] is not None
        else f"{point['label']} {point['predicted_ms']:.2f} ms"
        for point in record["missed"]
    )
    if missed:
        print(f"    missed its budget in the search: {missed}")
    skipped = (record.get("finalists") or {}).get("skipped") or {}
    for label, why in skipped.items():
        print(f"    finalist {label} skipped: {why}")
    if points and returned is not None:
        chosen, fastest = returned["predicted_ms"][card], points[0]
        if chosen > fastest["predicted_ms"] * (1 + 1e-6):
            print(
                f"    NOTE: the search returned a plan predicted at {chosen:.2f} ms, slower than "
                f"its own fastest trial within budget ({fastest['label']}, "
                f"{fastest['predicted_ms']:.2f} ms)"
            )


def print_cpu_timing(timing: Mapping[str, Any] | None) -> None:
    """What float8 emulation costs here: float8 wherever against float32, min and median."""
    if not timing:
        return
    f32, f8 = timing["float32"], timing["float8 wherever"]
    print(
        f"  CPU step here (float8 emulated), {len(f32['rounds'])} interleaved rounds: float32 "
        f"{f32['min']:.1f} ms min / {f32['median']:.1f} median; float8 wherever "
        f"{f8['min']:.1f} / {f8['median']:.1f}: {f8['min'] / f32['min']:.2f}x / "
        f"{f8['median'] / f32['median']:.2f}x float32"
    )


def print_not_slower(model: str, check: dict[str, Any], plans: Mapping[str, Any]) -> None:
    """One PASS/FAIL line of the second goal."""
    plan, card, best = check["plan"], check["card"], check["best_uniform"]
    if best is None:
        print(f"  FAIL {model} {plan}: no uniform plan holds the budget, nothing to compare with")
        return
    mine, theirs = plans[plan]["predicted_ms"][card], plans[best]["predicted_ms"][card]
    verdict = "PASS" if check["pass"] else "FAIL"
    budget_text = {True: "holds", False: "does NOT hold", None: "not retrained for"}[check["holds"]]
    print(
        f"  {verdict} {model} {plan}: {mine:.2f} ms on {card}, {check['ratio']:.3f}x the best "
        f"uniform plan holding the budget ({best}, {theirs:.2f} ms); {budget_text} its budget"
    )


def print_goals(result: Mapping[str, Any]) -> None:
    """The goals' verdicts with their figures."""
    print("\n== goals (budgets as held at the longer retraining)")
    speed = result.get("gpt_speedup")
    if speed is not None:
        words = {True: "holds", False: "does not hold", None: "not retrained"}
        figures = "; ".join(
            f"{item['plan']} {item['speedup']:.2f}x ({words[item['holds']]})"
            for item in speed["candidates"]
        )
        print(
            f"  {'PASS' if speed['pass'] else 'FAIL'} gpt on {GOAL_CARD}: searched or heuristic "
            f"plan >= {SPEEDUP_GOAL:.1f}x uniform bfloat16 while holding its budget: {figures}"
        )
    slower = result["not_slower"]
    print(
        f"  {'PASS' if slower['pass'] else 'FAIL'} no searched or heuristic plan predicted "
        "slower, on its card, than the fastest uniform plan (float32, bfloat16, float8 "
        "wherever) holding the budget:"
    )
    for kind in ("search", "heuristic"):
        failing = [
            check
            for check in slower["checks"]
            if check["plan"].startswith(kind) and not check["pass"]
        ]
        summary = "; ".join(
            f"{check['model']} {check['plan']} "
            + (
                f"{check['ratio']:.3f}x {check['best_uniform']}"
                if check["ratio"] is not None
                else "no uniform plan holds"
            )
            for check in failing
        )
        verdict = "PASS" if slower[f"{kind}_pass"] else "FAIL"
        print(f"    {verdict} {kind}: {summary or 'every plan at most 1.000x'}")
