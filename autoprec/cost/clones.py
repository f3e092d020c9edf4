"""Copies of a model under other policies: every layer in one dtype, or each named layer in its own."""

from __future__ import annotations

from collections.abc import Mapping

import keras

from .._core.dtypes import BFLOAT16, FLOAT8, canonical_dtype, policy_name
from ..errors import PlanError
from ..layers import layer_paths


def clone_with_uniform_policy(model: keras.Model, dtype: str) -> keras.Model:
    """Returns a copy of `model` (fresh weights, same architecture) with every layer in `dtype`.

    Each layer gets the `mixed_*` policy of `dtype` (`"float32"` for float32; for
    float8, `float8_from_mixed_bfloat16` on Dense/EinsumDense layers and
    `mixed_bfloat16` elsewhere); layers that refuse a policy keep theirs. `model` is left as it is. The copy
    of a compiled model is compiled from its compile config (as
    `keras.models.clone_model` does, with an optimizer of its own); compile it
    again to train it another way (float16 wants a `LossScaleOptimizer`).

    Args:
        model: a Functional or Sequential model (`keras.models.clone_model`
            cannot copy a subclassed one).
        dtype: the compute dtype of every layer (any alias `canonical_dtype` accepts).

    Returns:
        The copy.

    Example:

    ```python
    copy = autoprec.cost.clone_with_uniform_policy(model, "bfloat16")
    copy.layers[-1].dtype_policy.name  # "mixed_bfloat16"
    ```
    """
    dtype = canonical_dtype(dtype, "clone_with_uniform_policy")
    clone = keras.models.clone_model(model)
    for layer in layer_paths(clone).values():
        _set_policy(layer, dtype)
    return clone


def _set_policy(layer: keras.layers.Layer, dtype: str) -> None:
    if dtype == FLOAT8 and not isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
        dtype = BFLOAT16  # float8's source: a layer without a float8 path computes in it
    try:
        layer.dtype_policy = policy_name(dtype)
    except Exception:  # noqa: BLE001 - a layer that refuses a policy keeps its own
        pass


def clone_with_policies(model: keras.Model, dtypes: Mapping[str, str]) -> keras.Model:
    """Returns a copy of `model` (fresh weights) with each named layer in its dtype."""
    names = {
        path: canonical_dtype(dtype, f"clone_with_policies[{path!r}]")
        for path, dtype in dtypes.items()
    }
    clone = keras.models.clone_model(model)
    paths = layer_paths(clone)
    missing = sorted(set(names) - set(paths))
    if missing:
        raise PlanError(
            f"clone_with_policies: {', '.join(repr(path) for path in missing[:5])} is not a "
            f"layer of model {model.name!r}; name layers by their "
            "autoprec.layers.layer_paths(model) paths."
        )
    for path, dtype in names.items():
        _set_policy(paths[path], dtype)
    return clone
