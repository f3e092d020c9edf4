"""Lookup: which dtype each layer of a plan computes in, followers included."""

from __future__ import annotations

from collections.abc import Mapping

from .._core.dtypes import BFLOAT16, FLOAT8, canonical_float8_source
from ..layers import LayerInfo
from .rules import PlanRule, first_rule_dtype
from .view import PlanView


def decided_layers(
    explicit: Mapping[str, str],
    rules: tuple[PlanRule, ...],
    default: str,
    layer_info: Mapping[str, LayerInfo],
    followers: Mapping[str, str],
) -> dict[str, str]:
    """Returns the layers a plan decides: explicit entries less followers, plus rule/default
    fill-ins."""
    if not layer_info:
        return dict(explicit)
    own = {path: dtype for path, dtype in explicit.items() if path not in followers}
    decided = {}
    for path, info in layer_info.items():
        if path in followers:
            continue
        if path in own:
            decided[path] = own[path]
        else:
            decided[path] = first_rule_dtype(rules, path, info.class_name, default)
    decided.update({path: dtype for path, dtype in own.items() if path not in decided})
    return decided


def dtype_for(plan: PlanView, path: str, class_name: str | None = None) -> str:
    """Returns the compute dtype for a layer: exact path, then rules in order, then default."""
    seen = set()
    while path not in plan.layers and path in plan.followers and path not in seen:
        seen.add(path)
        path, class_name = plan.followers[path], None
    if path in plan.layers:
        dtype = plan.layers[path]
    else:
        if class_name is None and path in plan.layer_info:
            class_name = plan.layer_info[path].class_name
        dtype = first_rule_dtype(plan.rules, path, class_name, plan.default)
    return _float8_source(plan) if seen and dtype == FLOAT8 else dtype


def resolve(plan: PlanView, infos: Mapping[str, LayerInfo] | None = None) -> dict[str, str]:
    """Returns the dtype of every layer in `infos`, followers taking their source's dtype."""
    if infos is None:
        infos = plan.layer_info
    own = {
        path: dtype_for(plan, path, info.class_name)
        for path, info in infos.items()
        if info.follows is None or (path in plan.layers and not info.pass_through)
    }
    return resolve_followers(own, infos, plan.default, _float8_source(plan))


def every_layer(plan: PlanView) -> dict[str, str]:
    """Returns `{path: dtype}` of the decided layers and the followers, in the model's order."""
    if not plan.layer_info:
        return dict(plan.layers)
    resolved = resolve(plan)
    resolved.update({path: dtype for path, dtype in plan.layers.items() if path not in resolved})
    return resolved


def resolve_followers(
    own: Mapping[str, str],
    infos: Mapping[str, LayerInfo],
    default: str,
    float8_source: str = BFLOAT16,
) -> dict[str, str]:
    """Returns `own` completed with each follower's dtype: the dtype of the layer it follows."""
    resolved = dict(own)

    def lookup(path: str, depth: int = 0) -> str:
        if path in resolved:
            return resolved[path]
        info = infos.get(path)
        if info is None or info.follows is None or depth > len(infos):
            return default
        value = lookup(info.follows, depth + 1)
        value = float8_source if value == FLOAT8 else value
        resolved[path] = value
        return value

    for path in infos:
        lookup(path)
    return {path: resolved[path] for path in infos if path in resolved}


def _float8_source(plan: PlanView) -> str:
    """The dtype of float8 layers' non-matmul work, from the plan's metadata (bfloat16 by default)."""
    return canonical_float8_source(plan.metadata.get("float8_source"))
