"""Edits: the decided layers that `with_dtype` and `with_rule` produce, and their refusals."""

from __future__ import annotations

import fnmatch

from .._core.dtypes import FLOAT8, canonical_dtype, float8_eligible
from ..errors import PlanError
from .hints import did_you_mean, follower_message
from .rules import PlanRule, rule_targets
from .view import PlanView


def is_dtype(value: object) -> bool:
    """Returns whether `value` is a dtype name autoprec accepts (aliases included)."""
    try:
        canonical_dtype(value)
    except PlanError:
        return False
    return True


def layers_with_dtype(plan: PlanView, path_or_glob: str, dtype: str) -> dict[str, str]:
    """Returns the plan's decided layers with those `path_or_glob` names set to `dtype`."""
    known = list(plan.layer_info) or list(plan.layers)
    if path_or_glob not in known and is_dtype(path_or_glob) and not is_dtype(dtype):
        raise PlanError(
            f"with_dtype({path_or_glob!r}, {dtype!r}): the layer comes first, the dtype "
            f"last; write with_dtype({dtype!r}, {path_or_glob!r})."
        )
    dtype = canonical_dtype(dtype)
    if path_or_glob in known:
        prefix = path_or_glob + "/"
        matched = [path for path in known if path == path_or_glob or path.startswith(prefix)]
    else:
        matched = [path for path in known if fnmatch.fnmatchcase(path, path_or_glob)]
    if not matched:
        raise PlanError(
            f"with_dtype: {path_or_glob!r} matches no layer of the plan"
            f"{did_you_mean(path_or_glob, known)}. Paths look like "
            f"{', '.join(repr(path) for path in known[:3])}; see plan.summary()."
        )
    decided = [path for path in matched if path not in plan.followers]
    if not decided:
        message = follower_message(matched[0], plan.followers, plan.layer_info)
        raise PlanError(f"with_dtype: {message}")
    if dtype == FLOAT8 and plan.layer_info:
        decided = _float8_targets(plan, path_or_glob, decided)
    return {**plan.layers, **dict.fromkeys(decided, dtype)}


def _float8_targets(plan: PlanView, path_or_glob: str, decided: list[str]) -> list[str]:
    """The decided layers float8 may go to: Dense and EinsumDense; refuses a name with none."""
    classes = {
        path: plan.layer_info[path].class_name for path in decided if path in plan.layer_info
    }
    eligible = [path for path in decided if float8_eligible(classes.get(path))]
    if eligible:
        return eligible
    named = ", ".join(f"{path!r} ({classes.get(path, '?')})" for path in decided[:3])
    raise PlanError(
        f"with_dtype({path_or_glob!r}, 'float8'): float8 is only for Dense and EinsumDense "
        f"layers (Keras has no float8 path for {named}); give it bfloat16, float16 or float32."
    )


def layers_with_rule(plan: PlanView, rule: PlanRule) -> dict[str, str]:
    """Returns the plan's decided layers with those `rule` matches set to its dtype."""
    targets = rule_targets(rule, plan.layers, plan.followers, plan.layer_info)
    return {**plan.layers, **dict.fromkeys(targets, rule.dtype)}
