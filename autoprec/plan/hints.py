"""The hints a plan's errors give: names close to a typo, and the layer a follower follows."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from ..layers import LayerInfo


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
