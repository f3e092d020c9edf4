"""Summary: a plan as a text table of its layers, with totals per dtype."""

from __future__ import annotations

from .._core.dtypes import COMPUTE_DTYPES, FLOAT8
from .lookup import every_layer
from .view import PlanView

#: One table row: path, class name, dtype, parameters, note (whom a follower follows).
Row = tuple[str, str, str, int, str]

_HEADERS = ("layer", "class", "dtype", "params", "")


def plan_summary(plan: PlanView) -> str:
    """Returns a text table: path, class, dtype, parameters, and totals per dtype."""
    rows = summary_rows(plan)
    title = (
        f"PrecisionPlan for {plan.model_name or 'model'} "
        f"(default {plan.default}, {len(plan.rules)} rule(s))"
    )
    decided = [row for row in rows if row[0] in plan.layers]
    return "\n".join([title, *_table_lines(rows), "", *_total_lines(decided), *_notes(plan)])


def summary_rows(plan: PlanView) -> list[Row]:
    """Returns one row per layer, decided layers and followers, in the model's order."""
    rows = []
    for path, dtype in every_layer(plan).items():
        info = plan.layer_info.get(path)
        class_name = info.class_name if info else "?"
        parameters = info.parameters if info else 0
        note = f"follows {plan.followers[path]}" if path in plan.followers else ""
        rows.append((path, class_name, dtype, parameters, note))
    return rows


def _table_lines(rows: list[Row]) -> list[str]:
    """Returns the header, the rule under it and one aligned line per row."""
    widths = [
        max([len(_HEADERS[column])] + [len(str(row[column])) for row in rows])
        for column in range(4)
    ]
    lines = [
        "  ".join(header.ljust(width) for header, width in zip(_HEADERS, widths)).rstrip(),
        "  ".join("-" * width for width in widths),
    ]
    for path, class_name, dtype, parameters, note in rows:
        lines.append(
            f"{path:<{widths[0]}}  {class_name:<{widths[1]}}  {dtype:<{widths[2]}}  "
            f"{parameters:>{widths[3]},}  {note}".rstrip()
        )
    return lines


def _total_lines(decided: list[Row]) -> list[str]:
    """Returns one line per compute dtype: layers and parameters of the decided rows."""
    total_parameters = sum(row[3] for row in decided) or 1
    lines = []
    has_float8 = any(row[2] == FLOAT8 for row in decided)
    for dtype in (*COMPUTE_DTYPES, FLOAT8) if has_float8 else COMPUTE_DTYPES:
        count = sum(1 for row in decided if row[2] == dtype)
        parameters = sum(row[3] for row in decided if row[2] == dtype)
        lines.append(
            f"{dtype:<9} {count:>4} layers  {parameters:>12,} params "
            f"({100.0 * parameters / total_parameters:5.1f} %)"
        )
    return lines


def _notes(plan: PlanView) -> list[str]:
    """Returns the closing lines: followers, rules and events."""
    lines = []
    if plan.followers:
        lines.append(f"{len(plan.followers)} follower(s) take the dtype of the layer they follow")
    lines.extend(f"rule: {rule.to_dict()}" for rule in plan.rules)
    if plan.events:
        lines.append(f"{len(plan.events)} event(s): see plan.events")
    return lines
