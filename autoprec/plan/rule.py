"""`PlanRule`: a dtype for every layer whose path or class matches, and its parsing."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping
from typing import Any

from .._core.dtypes import canonical_dtype
from ..errors import PlanError


@dataclasses.dataclass(frozen=True, init=False)
class PlanRule:
    """One ordered pattern rule: a glob on layer paths and/or a glob on layer class names.

    Arguments are keyword-only and read in the order the plan reads everywhere:
    where (path, class name), then the dtype.

    Args:
        path: glob on stable layer paths (`fnmatch` syntax, `*` also crosses `/`), or `None`.
        class_name: glob on layer class names (e.g. `"Softmax"`, `"*Normalization"`), or `None`.
        dtype: compute dtype given to matching layers.

    Example:

    ```python
    rule = autoprec.PlanRule(class_name="Softmax", dtype="float32")
    rule.matches("attention/softmax", "Softmax")  # True
    ```
    """

    path: str | None
    class_name: str | None
    dtype: str

    def __init__(
        self,
        *positional: Any,
        path: str | None = None,
        class_name: str | None = None,
        dtype: str | None = None,
    ) -> None:
        if positional:
            raise PlanError(
                f"PlanRule{tuple(positional)!r}: arguments are keyword-only, where first, dtype "
                "last; write e.g. PlanRule(class_name='Softmax', dtype='float32')."
            )
        if dtype is None:
            raise PlanError(
                "PlanRule: missing dtype; write e.g. PlanRule(class_name='Softmax', dtype='float32')."
            )
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "class_name", class_name)
        object.__setattr__(self, "dtype", dtype)

    def matches(self, path: str, class_name: str | None) -> bool:
        """Returns whether the rule applies to a layer with this path and class name.

        Args:
            path: the layer's stable path.
            class_name: the layer's class name, or `None` when unknown (a class
                rule then does not match).

        Returns:
            `True` when every glob the rule has matches.
        """
        if self.path is not None and not fnmatch.fnmatchcase(path, self.path):
            return False
        if self.class_name is not None:
            if class_name is None or not fnmatch.fnmatchcase(class_name, self.class_name):
                return False
        return True

    def to_dict(self) -> dict[str, str]:
        """Returns the rule as it is written in plan JSON: `path`, `class`, `dtype`."""
        entry: dict[str, str] = {}
        if self.path is not None:
            entry["path"] = self.path
        if self.class_name is not None:
            entry["class"] = self.class_name
        entry["dtype"] = self.dtype
        return entry

    def __str__(self) -> str:
        where = ", ".join(
            f"{key}={value!r}"
            for key, value in (("path", self.path), ("class", self.class_name))
            if value is not None
        )
        return f"rule {where} -> {self.dtype}"


def coerce_rule(rule: PlanRule | Mapping[str, Any], index: int, source: str = "") -> PlanRule:
    """Returns `rule` as a validated `PlanRule` (from a `PlanRule` or a JSON-style dict).

    Args:
        rule: a `PlanRule` or a dict like `{"class": "Softmax", "dtype": "float32"}`.
        index: the rule's position, named in error messages (`rules[index]`).
        source: what to call the input in error messages (a file name), if any.

    Returns:
        A `PlanRule` with a canonical dtype.

    Raises:
        PlanError: naming `rules[index]` and how to fix it.

    Example:

    ```python
    coerce_rule({"class": "Softmax", "dtype": "fp32"}, 0).dtype  # "float32"
    ```
    """
    where = f"{source}: rules[{index}]" if source else f"rules[{index}]"
    if isinstance(rule, PlanRule):
        return PlanRule(
            path=rule.path, class_name=rule.class_name, dtype=canonical_dtype(rule.dtype, where)
        )
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
    return PlanRule(
        path=path, class_name=class_name, dtype=canonical_dtype(rule["dtype"], f"{where}.dtype")
    )
