"""The rule engine: `PlanRule`, reading rules, which layers a rule reaches, and the hints errors give."""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

from .._core.dtypes import FLOAT8, canonical_dtype, float8_eligible
from ..errors import PlanError
from ..layers import LayerInfo


@dataclasses.dataclass(frozen=True, init=False)
class PlanRule:
    """One ordered rule: a glob on layer paths and/or on class names (`*` crosses `/`), and the
    dtype it gives; arguments are keyword-only, read as where (path, class name), then dtype."""

    path: str | None
    class_name: str | None
    dtype: str

    def __init__(
        self, *, path: str | None = None, class_name: str | None = None, dtype: str | None = None
    ) -> None:
        if dtype is None:
            raise PlanError(
                "PlanRule: missing dtype; write e.g. PlanRule(class_name='Softmax', dtype='float32')."
            )
        for name, value in (("path", path), ("class_name", class_name), ("dtype", dtype)):
            object.__setattr__(self, name, value)

    def matches(self, path: str, class_name: str | None) -> bool:
        """Returns whether every glob of the rule matches (a class rule never matches `None`)."""
        if self.path is not None and not fnmatch.fnmatchcase(path, self.path):
            return False
        if self.class_name is None:
            return True
        return class_name is not None and fnmatch.fnmatchcase(class_name, self.class_name)

    def to_dict(self) -> dict[str, str]:
        """Returns the rule as it is written in plan JSON: `path`, `class`, `dtype`."""
        where = {"path": self.path, "class": self.class_name}
        return {
            **{key: value for key, value in where.items() if value is not None},
            "dtype": self.dtype,
        }

    def __str__(self) -> str:
        where = ", ".join(
            f"{key}={value!r}" for key, value in self.to_dict().items() if key != "dtype"
        )
        return f"rule {where} -> {self.dtype}"


def coerce_rule(rule: PlanRule | Mapping[str, Any], index: int, source: str = "") -> PlanRule:
    """Returns `rule` as a validated `PlanRule` (from a `PlanRule` or a JSON-style dict)."""
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


def first_rule_dtype(
    rules: Iterable[PlanRule], path: str, class_name: str | None, default: str
) -> str:
    """Returns the dtype of the first rule matching the layer, else `default`."""
    for rule in rules:
        if rule.dtype == FLOAT8 and not float8_eligible(class_name):
            continue  # a float8 rule reaches only the layers with a float8 path
        if rule.matches(path, class_name):
            return rule.dtype
    return default


def rule_targets(
    rule: PlanRule,
    layers: Mapping[str, str],
    followers: Mapping[str, str],
    layer_info: Mapping[str, LayerInfo],
) -> list[str]:
    """Returns the decided layers that `rule` matches; refuses a rule that can match none."""
    if not layer_info:
        return _hand_named_targets(rule, layers)

    def class_of(target: str) -> str | None:
        info = layer_info.get(target)
        return info.class_name if info is not None else None

    targets = [target for target in layers if rule.matches(target, class_of(target))]
    if rule.dtype == FLOAT8 and targets:
        eligible = [target for target in targets if float8_eligible(class_of(target))]
        if not eligible:
            classes = sorted({class_of(target) or "?" for target in targets})
            raise PlanError(
                f"with_rule: {rule} matches only layers without a float8 path "
                f"({', '.join(classes[:8])}); float8 is for Dense and EinsumDense layers."
            )
        return eligible
    if targets:
        return targets
    following = [target for target in followers if rule.matches(target, class_of(target))]
    if following:
        message = follower_message(following[0], followers, layer_info)
        raise PlanError(f"with_rule: {rule} matches only followers: {message}")
    classes = sorted({class_of(target) or "?" for target in layers})
    hint = did_you_mean(rule.class_name, classes) if rule.class_name else ""
    raise PlanError(
        f"with_rule: {rule} matches no layer of the plan{hint}; its classes are "
        f"{', '.join(classes[:8])}{'...' if len(classes) > 8 else ''} (see plan.summary())."
    )


def _hand_named_targets(rule: PlanRule, layers: Mapping[str, str]) -> list[str]:
    """Returns the named layers a path rule matches in a plan that does not know their classes."""
    if rule.class_name is not None and layers:
        named = ", ".join(repr(path) for path in list(layers)[:3])
        raise PlanError(
            f"with_rule: the plan names layers ({named}...) without their class names, "
            f"so class_name={rule.class_name!r} cannot be matched against them. Set "
            "those with plan.with_dtype(path, dtype), or make the plan from the model "
            "(PrecisionPlan.uniform / from_model) so it knows each layer's class."
        )
    return [target for target in layers if rule.matches(target, None)]


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """Returns ` (did you mean 'a', 'b'?)` naming the candidates closest to `name`, or `""`."""
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.5)
    return f" (did you mean {', '.join(repr(match) for match in close)}?)" if close else ""


def followed_source(path: str, followers: Mapping[str, str]) -> str:
    """Returns the decided layer at the end of `path`'s chain of followers (`path` if it decides)."""
    seen = set()
    while path in followers and path not in seen:
        seen.add(path)
        path = followers[path]
    return path


def follower_message(
    path: str, followers: Mapping[str, str], layer_info: Mapping[str, LayerInfo]
) -> str:
    """Says which layer the follower `path` takes its dtype from, and to set that one instead."""
    source = followed_source(path, followers)
    info = layer_info.get(path)
    kind = "a pass-through layer" if info is None or info.pass_through else "a nested model"
    class_name = f" ({info.class_name})" if info is not None else ""
    return (
        f"{path!r} is {kind}{class_name}; it follows the dtype of {source!r}. "
        f"Set {source!r} instead."
    )
