"""Keras interop: a plan as a `keras.dtype_policies.DTypePolicyMap`, and back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._core.dtypes import POLICY_FOR_DTYPE, dtype_of_policy, policy_name
from ..layers import LayerInfo
from .lookup import resolve
from .view import PlanView


def to_dtype_policy_map(plan: PlanView) -> Any:
    """Returns a Keras `DTypePolicyMap` keyed by Keras layer paths, defaulting to the plan's
    default."""
    import keras

    policy_map = keras.dtype_policies.DTypePolicyMap(
        default_policy=keras.dtype_policies.get(POLICY_FOR_DTYPE[plan.default])
    )
    dtypes = resolve(plan) if plan.layer_info else dict(plan.layers)
    for path, dtype in dtypes.items():
        info = plan.layer_info.get(path)
        key = info.keras_path if info is not None and info.keras_path else path
        if key in policy_map:
            continue
        policy_map[key] = keras.dtype_policies.get(
            policy_name(dtype, plan.metadata.get("float8_source") or "bfloat16")
        )
    return policy_map


def dtypes_from_policy_map(
    infos: Mapping[str, LayerInfo], policy_map: Any
) -> tuple[dict[str, str], str]:
    """Returns the `{path: dtype}` a Keras `DTypePolicyMap` gives a model's layers, and its default."""
    layers = {
        path: dtype_of_policy(policy_map[info.keras_path or path]) for path, info in infos.items()
    }
    return layers, dtype_of_policy(policy_map.default_policy)
