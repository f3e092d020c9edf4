"""The compact report printed once when the automatic plan is applied: counts, speedup, float32 layers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._core.dtypes import count_dtypes, counts_text
from ..cost import Estimate
from ..plan import PrecisionPlan


def report_lines(
    plan: PrecisionPlan, estimate: Estimate | None, dtypes: Mapping[str, str]
) -> list[str]:
    """Returns the compact report printed once when the automatic plan is applied.

    Args:
        plan: the plan as applied, with `metadata["hardware"]` and `["evidence"]`.
        estimate: the cost estimate behind it, or `None`.
        dtypes: `{path: dtype}` each layer computes in.

    Returns:
        One line of counts and predicted speedup, then a line per float32 layer (at most 8).

    Example:

    ```python
    lines = report_lines(plan, estimate, handle.dtypes)
    ```
    """
    speedup = estimate.speedup if estimate is not None else None
    lines = [
        "autoprec: automatic plan: "
        + counts_text(count_dtypes(dtypes.values()))
        + " layer(s)"
        + (f"; predicted speedup {speedup:.2f}x over float32" if speedup else "")
        + f" on {plan.metadata.get('hardware')}"
    ]
    evidence = {
        path: entry
        for path, entry in (plan.metadata.get("evidence") or {}).items()
        if dtypes.get(path, "float32") == "float32"
    }
    for path, entry in list(evidence.items())[:8]:
        lines.append(f"  float32 {path}: {_float32_reason(entry)}")
    if len(evidence) > 8:
        lines.append(f"  ... and {len(evidence) - 8} more float32 layer(s); see plan.summary()")
    return lines


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
