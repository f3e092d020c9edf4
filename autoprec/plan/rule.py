"""`PlanRule`: a dtype for every layer whose path or class matches, and its parsing."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping
from typing import Any

from .._core.dtypes import (
    canonical_dtype,
)
from ..errors import PlanError


@dataclasses.dataclass(frozen=True)
class PlanRule:
    """One ordered pattern rule: a glob on layer paths and/or a glob on layer class names.

    Attributes:
        dtype: compute dtype given to matching layers.
        path: glob on stable layer paths (`fnmatch` syntax, `*` also crosses `/`), or `None`.
        class_name: glob on layer class names (e.g. `"Softmax"`, `"*Normalization"`), or `None`.
    """

    dtype: str
    path: str | None = None
    class_name: str | None = None

    def matches(self, path: str, class_name: str | None) -> bool:
        """Returns whether the rule applies to a layer with this path and class name."""
        if self.path is not None and not fnmatch.fnmatchcase(path, self.path):
            return False
        if self.class_name is not None:
            if class_name is None or not fnmatch.fnmatchcase(class_name, self.class_name):
                return False
        return True

    def to_dict(self) -> dict[str, str]:
        entry: dict[str, str] = {}
        if self.path is not None:
            entry["path"] = self.path
        if self.class_name is not None:
            entry["class"] = self.class_name
        entry["dtype"] = self.dtype
        return entry


def _coerce_rule(rule: PlanRule | Mapping[str, Any], index: int, source: str = "") -> PlanRule:
    where = f"{source}: rules[{index}]" if source else f"rules[{index}]"
    if isinstance(rule, PlanRule):
        return PlanRule(canonical_dtype(rule.dtype, where), rule.path, rule.class_name)
    if not isinstance(rule, Mapping):
        raise PlanError(
            f"{where}: expected an object like {{'class': 'Softmax', 'dtype': 'float32'}}, "
            f"got {type(rule).__name__}."
        )
    unknown = set(rule) - {"path", "class", "dtype"}
    if unknown:
        raise PlanError(
            f"{where}: unknown key(s) {sorted(unknown)}; a rule has 'path' and/or 'class', and 'dtype'."
        )
    if "dtype" not in rule:
        raise PlanError(f'{where}: missing \'dtype\'; add e.g. "dtype": "float32".')
    path, class_name = rule.get("path"), rule.get("class")
    if path is None and class_name is None:
        raise PlanError(f"{where}: give 'path' (a glob on layer paths) or 'class' (a class name).")
    for key, value in (("path", path), ("class", class_name)):
        if value is not None and not isinstance(value, str):
            raise PlanError(f"{where}.{key}: expected a string, got {type(value).__name__}.")
    return PlanRule(canonical_dtype(rule["dtype"], f"{where}.dtype"), path, class_name)
