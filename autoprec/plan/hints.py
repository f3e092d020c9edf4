"""The hints a plan's errors give: names close to a typo, and the layer a follower follows."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from ..layers import LayerInfo


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """Returns ` (did you mean 'a', 'b'?)` naming the candidates closest to `name`, or `""`.

    Args:
        name: what the user wrote (a layer path, a class name).
        candidates: the names that exist.

    Returns:
        The hint, with a leading space, or an empty string when nothing is close.

    Example:

    ```python
    did_you_mean("dense_9", ["dense", "dense_1"])  # " (did you mean 'dense_1', 'dense'?)"
    ```
    """
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.5)
    return f" (did you mean {', '.join(repr(match) for match in close)}?)" if close else ""


def followed_source(path: str, followers: Mapping[str, str]) -> str:
    """Returns the decided layer at the end of `path`'s chain of followers (`path` if it decides).

    Args:
        path: a layer path.
        followers: `{follower: followed path}`, as `PrecisionPlan.followers`.

    Returns:
        The first path along the chain that follows nothing (a cycle stops the walk).

    Example:

    ```python
    followed_source("flatten", {"flatten": "pool", "pool": "conv"})  # "conv"
    ```
    """
    seen = set()
    while path in followers and path not in seen:
        seen.add(path)
        path = followers[path]
    return path


def follower_message(
    path: str, followers: Mapping[str, str], layer_info: Mapping[str, LayerInfo]
) -> str:
    """Says which layer the follower `path` takes its dtype from, and to set that one instead.

    Args:
        path: a follower's path (a key of `followers`).
        followers: `{follower: followed path}`.
        layer_info: `{path: LayerInfo}` of the plan's model, for the follower's kind and class.

    Returns:
        A sentence for an error message.

    Example:

    ```python
    follower_message("dropout", {"dropout": "dense"}, {})
    # "'dropout' is a pass-through layer; it follows the dtype of 'dense'. Set 'dense' instead."
    ```
    """
    source = followed_source(path, followers)
    info = layer_info.get(path)
    kind = "a pass-through layer" if info is None or info.pass_through else "a nested model"
    class_name = f" ({info.class_name})" if info is not None else ""
    return (
        f"{path!r} is {kind}{class_name}; it follows the dtype of {source!r}. "
        f"Set {source!r} instead."
    )
