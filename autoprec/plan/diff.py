"""Diff: what two plans decide differently (layers, rules, default), as a `PlanDiff`."""

from __future__ import annotations

import dataclasses
import difflib

from .rules import PlanRule
from .view import PlanView


@dataclasses.dataclass(frozen=True)
class PlanDiff:
    """Differences between two plans, as returned by `PrecisionPlan.diff`.

    A diff is empty (`bool(diff)` is `False`) exactly when the two plans are
    equal (`==`): same decided layers, same rules in the same order, same default.

    Attributes:
        changed: `(path, dtype_in_self, dtype_in_other)` for layers in both plans with different dtypes.
        only_in_self: paths only the first plan names.
        only_in_other: paths only the second plan names.
        default_changed: `(self.default, other.default)` if the defaults differ, else `None`.
        rules_changed: `(self.rules, other.rules)` if the rules differ (in content or
            order), else `None`.

    Example:

    ```python
    diff = plan.diff(plan.with_rule(class_name="Softmax", dtype="float32"))
    print(diff)  # ~ attention/softmax  bfloat16 -> float32, then + rule class='Softmax' -> float32
    ```
    """

    changed: tuple[tuple[str, str, str], ...]
    only_in_self: tuple[str, ...]
    only_in_other: tuple[str, ...]
    default_changed: tuple[str, str] | None
    rules_changed: tuple[tuple[PlanRule, ...], tuple[PlanRule, ...]] | None = None

    def __bool__(self) -> bool:
        return bool(
            self.changed
            or self.only_in_self
            or self.only_in_other
            or self.default_changed
            or self.rules_changed
        )

    def __str__(self) -> str:
        if not self:
            return "plans are identical"
        lines = []
        if self.default_changed:
            lines.append(f"default: {self.default_changed[0]} -> {self.default_changed[1]}")
        width = max([len(path) for path, _, _ in self.changed] + [5])
        for path, before, after in self.changed:
            lines.append(f"~ {path:<{width}}  {before} -> {after}")
        for path in self.only_in_self:
            lines.append(f"- {path}")
        for path in self.only_in_other:
            lines.append(f"+ {path}")
        if self.rules_changed:
            lines.extend(_rule_lines(*self.rules_changed))
        return "\n".join(lines)


def diff_plans(first: PlanView, second: PlanView) -> PlanDiff:
    """Returns what `first` and `second` decide differently: layers, rules and default."""
    mine, theirs = first.layers, second.layers
    changed = tuple(
        (path, mine[path], theirs[path])
        for path in mine
        if path in theirs and mine[path] != theirs[path]
    )
    defaults = (first.default, second.default)
    return PlanDiff(
        changed=changed,
        only_in_self=tuple(path for path in mine if path not in theirs),
        only_in_other=tuple(path for path in theirs if path not in mine),
        default_changed=defaults if defaults[0] != defaults[1] else None,
        rules_changed=(first.rules, second.rules) if first.rules != second.rules else None,
    )


def _rule_lines(before: tuple[PlanRule, ...], after: tuple[PlanRule, ...]) -> list[str]:
    """Returns `- rule ...` / `+ rule ...` lines, numbered by position, turning `before` into
    `after`."""
    lines = []
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for tag, first_start, first_end, second_start, second_end in matcher.get_opcodes():
        if tag == "equal":
            continue
        for index in range(first_start, first_end):
            lines.append(f"- rules[{index}]: {before[index]}")
        for index in range(second_start, second_end):
            lines.append(f"+ rules[{index}]: {after[index]}")
    return lines
