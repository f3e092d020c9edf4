"""`PlanDiff`: what two plans assign differently, layer by layer."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PlanDiff:
    """Differences between two plans, as returned by `PrecisionPlan.diff`.

    Attributes:
        changed: `(path, dtype_in_self, dtype_in_other)` for layers in both plans with different dtypes.
        only_in_self: paths only the first plan names.
        only_in_other: paths only the second plan names.
        default_changed: `(self.default, other.default)` if the defaults differ, else `None`.
    """

    changed: tuple[tuple[str, str, str], ...]
    only_in_self: tuple[str, ...]
    only_in_other: tuple[str, ...]
    default_changed: tuple[str, str] | None

    def __bool__(self) -> bool:
        return bool(self.changed or self.only_in_self or self.only_in_other or self.default_changed)

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
        return "\n".join(lines)
