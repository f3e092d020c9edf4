"""The compact report printed once when the automatic plan is applied: counts, speedup, float32
layers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._core.dtypes import count_dtypes, counts_text
from ..cost import Estimate
from ..plan import PrecisionPlan


def report_lines(
    plan: PrecisionPlan, estimate: Estimate | None, dtypes: Mapping[str, str]
) -> list[str]:
    """Returns the compact report printed once when the automatic plan is applied."""
    speedup = estimate.speedup if estimate is not None else None
    lines = [
        "autoprec: automatic plan: "
        + counts_text(count_dtypes(dtypes.values()))
        + " layer(s)"
        + (f"; predicted speedup {speedup:.2f}x over float32" if speedup else "")
        + f" on {plan.metadata.get('hardware')}"
    ]
    start = plan.metadata.get("start")
    if isinstance(start, Mapping) and start.get("policy"):
        lines.append("  " + start_line(start))
    departures = _departures(plan, dtypes)
    for path, (dtype, reason) in list(departures.items())[:8]:
        lines.append(f"  {dtype} {path}: {reason}")
    if len(departures) > 8:
        lines.append(f"  ... and {len(departures) - 8} more; see plan.metadata['evidence']")
    return lines


def start_line(start: Mapping[str, Any]) -> str:
    """Returns the line saying which uniform policy the plan started from, and why."""
    steps = start.get("predicted_step_ms") or {}
    figures = ", ".join(f"{dtype} {ms:.3f} ms" for dtype, ms in steps.items())
    why = f"predicted fastest ({figures}; {start.get('costs')})" if figures else "no cost table"
    return f"start: uniform {start['policy']}, {why}"


def _departures(plan: PrecisionPlan, dtypes: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """`{path: (dtype, reason)}`: the heuristic's departures, or the search's float32 layers."""
    found = {}
    for path, entry in (plan.metadata.get("evidence") or {}).items():
        if not isinstance(entry, Mapping):
            continue
        dtype = dtypes.get(path, "float32")
        if entry.get("kind") is not None:
            if dtype == entry.get("dtype") or entry.get("dtype") is None:
                found[path] = (dtype, f"{entry['kind']}: {entry.get('reason', '')}")
        elif dtype == "float32":
            found[path] = (dtype, _float32_reason(entry))
    return found


def _float32_reason(entry: Mapping[str, Any]) -> str:
    """Returns why a layer stayed float32, from the heuristic's or the search's evidence."""
    if entry.get("reason"):
        return str(entry["reason"])
    removed = entry.get("removed") or {}
    if removed:
        return "; ".join(f"{dtype} ruled out: {why}" for dtype, why in removed.items())
    if entry.get("profile"):
        return f"float16 unsafe: {entry['profile']}"
    return "16-bit did not pay or did not hold the budget in the search"
