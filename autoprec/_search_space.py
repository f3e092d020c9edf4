"""What the search may choose: compute layers, their groups, and the dtypes each may take (level 1).

Also the small adapters to the profiler and the cost model, so that the search degrades
clearly (with a logged note) when one of them is missing or cannot run.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._core.dtypes import BFLOAT16, COMPUTE_DTYPES, FLOAT16, FLOAT32, canonical_dtype
from .layers import LayerInfo, layer_paths

logger = logging.getLogger("autoprec")

#: Layer classes kept in float32 by the heuristic unless evidence says otherwise
#: (peers' op lists: exp, log, softmax and norms in float32).
SENSITIVE_CLASS_PATTERNS: tuple[str, ...] = ("Softmax", "*Normalization", "LayerNorm*", "RMSNorm*")

#: Fallback order when a group's dtype is not allowed for one of its members.
_FALLBACK = {FLOAT16: (FLOAT16, BFLOAT16, FLOAT32), BFLOAT16: (BFLOAT16, FLOAT32)}

_BLOCK_TOKEN = re.compile(r"^block\d*$")


@dataclasses.dataclass(frozen=True)
class Group:
    """Layers that the search gives one dtype choice.

    Attributes:
        name: the Optuna parameter name (stable: derived from the first member's path).
        paths: member layer paths, in model order.
        choices: dtypes the search may pick for the group.
    """

    name: str
    paths: tuple[str, ...]
    choices: tuple[str, ...]


# ---------------------------------------------------------------------- layers


def compute_layers(infos: Mapping[str, LayerInfo]) -> list[str]:
    """Returns the paths that get a dtype of their own: not pass-through, not containers."""
    return [
        path
        for path, info in infos.items()
        if not info.pass_through and not info.is_container and info.follows is None
    ]


def output_layers(model, infos: Mapping[str, LayerInfo]) -> set[str]:
    """Returns the compute layers that produce the model's outputs (loss-adjacent)."""
    paths = layer_paths(model)
    path_of = {id(layer): path for path, layer in paths.items()}
    found: set[str] = set()
    outputs = getattr(model, "outputs", None) or []
    for tensor in outputs:
        history = getattr(tensor, "_keras_history", None)
        operation = getattr(history, "operation", None)
        if operation is not None and id(operation) in path_of:
            found.add(path_of[id(operation)])
    if not found:
        compute = compute_layers(infos)
        if compute:
            found.add(compute[-1])
    resolved = set()
    for path in found:
        depth = 0
        while path in infos and infos[path].follows and depth < 50:
            path = infos[path].follows
            depth += 1
        resolved.add(path)
    return resolved


def is_sensitive(info: LayerInfo) -> bool:
    """Returns whether the layer is one peers keep in float32 (softmax, normalisation)."""
    return any(
        fnmatch.fnmatchcase(info.class_name, pattern) for pattern in SENSITIVE_CLASS_PATTERNS
    )


def matches_any(path: str, info: LayerInfo, patterns: Iterable[str]) -> bool:
    """Returns whether a layer's path or class name matches one of the globs."""
    return any(
        fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(info.class_name, pattern)
        for pattern in patterns
    )


# ---------------------------------------------------------------------- groups


def _block_key(path: str) -> str | None:
    top = path.split("/", 1)[0]
    tokens = top.split("_")
    for index, token in enumerate(tokens):
        if _BLOCK_TOKEN.match(token):
            end = index + 1
            if token == "block" and end < len(tokens) and tokens[end].isdigit():
                end += 1
            return "_".join(tokens[:end])
    if "/" in path:
        return top
    return None


def group_layers(
    paths: Sequence[str],
    group_by: str | int,
    separate: Iterable[str] = (),
    max_groups: int = 32,
) -> list[list[str]]:
    """Splits compute layers (in model order) into groups of consecutive layers.

    Args:
        paths: compute-layer paths in model order.
        group_by: `"layer"` (one group each), `"block"` (by block name such as
            `conv2_block1` or `block_3`, or by top-level sub-model; unnamed stretches
            between blocks form one group), `"auto"` (layer up to 24 layers, else
            block), or an int: at most that many contiguous groups.
        separate: paths that always form a group of their own (output layers).
        max_groups: cap on the number of groups for `"block"`/`"auto"`.

    Returns:
        A list of groups, each a list of paths.
    """
    separate = set(separate)
    if group_by == "auto":
        group_by = "layer" if len(paths) <= 24 else "block"
    if group_by == "layer":
        return [[path] for path in paths]
    if isinstance(group_by, int) and not isinstance(group_by, bool):
        return _contiguous_chunks(paths, group_by, separate)
    if group_by != "block":
        raise ValueError(f"group_by must be 'layer', 'block', 'auto' or an int, got {group_by!r}.")
    groups: list[list[str]] = []
    previous_key: object = object()
    for path in paths:
        if path in separate:
            groups.append([path])
            previous_key = object()
            continue
        key = _block_key(path) or "<between blocks>"
        if key == previous_key and groups:
            groups[-1].append(path)
        else:
            groups.append([path])
        previous_key = key
    if len(groups) > max_groups:
        return _contiguous_chunks(paths, max_groups, separate)
    return groups


def _contiguous_chunks(paths: Sequence[str], count: int, separate: set[str]) -> list[list[str]]:
    if count < 1:
        raise ValueError(f"group_by as an int must be at least 1, got {count}.")
    ordinary = [path for path in paths if path not in separate]
    size = max(1, math.ceil(len(ordinary) / max(1, count - len(separate & set(paths)))))
    groups: list[list[str]] = []
    current: list[str] = []
    for path in paths:
        if path in separate:
            if current:
                groups.append(current)
                current = []
            groups.append([path])
            continue
        current.append(path)
        if len(current) >= size:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


def resolve_member(choice: str, allowed: Sequence[str]) -> str:
    """Returns the dtype a member takes when its group picks `choice`: the choice or a wider one."""
    for candidate in _FALLBACK.get(choice, (choice,)):
        if candidate in allowed:
            return candidate
    return FLOAT32


def make_groups(
    grouped_paths: Sequence[Sequence[str]], allowed: Mapping[str, Sequence[str]]
) -> list[Group]:
    """Builds `Group`s whose choices are the union of their members' allowed dtypes."""
    groups = []
    for members in grouped_paths:
        union = [dtype for dtype in COMPUTE_DTYPES if any(dtype in allowed[p] for p in members)]
        name = f"dtype:{members[0]}" + (f"+{len(members) - 1}" if len(members) > 1 else "")
        groups.append(Group(name=name, paths=tuple(members), choices=tuple(union)))
    return groups


# ---------------------------------------------------------------------- adapters


def float16_unsafe_layers(profile: Any) -> dict[str, str]:
    """Returns `{path: reason}` for layers a profile says cannot fit float16 even with loss scaling.

    Reads `profile.layers[path]` duck-typed: a `float16_safe` boolean if present, else
    overflow fractions (`float16_overflow_fraction`, `activation_float16_overflow`...).

    Args:
        profile: an `autoprec.profiler.Profile`, or `None`.

    Returns:
        `{path: reason}`; empty when the profile is `None` or says nothing usable.
    """
    if profile is None:
        return {}
    layers = getattr(profile, "layers", None) or {}
    unsafe = {}
    for path, stats in layers.items():
        reason = _unsafe_reason(stats)
        if reason:
            unsafe[path] = reason
    return unsafe


def _unsafe_reason(stats: Any) -> str | None:
    for name in ("float16_safe", "fits_float16", "safe_float16"):
        value = _read(stats, name)
        if isinstance(value, bool):
            if value:
                return None
            why = _read(stats, "float16_reason") or _read(stats, "reason")
            return f"profile: {name}=False" + (f" ({why})" if why else "")
    for name in (
        "float16_overflow_fraction",
        "activation_float16_overflow",
        "overflow_fraction",
        "activation_overflow_fraction",
    ):
        value = _read(stats, name)
        if isinstance(value, (int, float)) and value > 0:
            return f"profile: {name}={value:.3g} (values above the float16 maximum 65504)"
    return None


def _read(stats: Any, name: str) -> Any:
    value = stats.get(name) if isinstance(stats, Mapping) else getattr(stats, name, None)
    return value() if callable(value) else value


def run_profiler(model, data: Any, steps: int, batch_size: int = 32) -> Any:
    """Profiles the model with `autoprec.profiler.profile`, or returns `None` with a logged note."""
    try:
        from . import profiler
    except ImportError:
        logger.info(
            "autoprec.search: autoprec.profiler is not available; level-1 profile "
            "feasibility is skipped (float16 stays a choice for every layer)."
        )
        return None
    function = getattr(profiler, "profile", None)
    if function is None:
        logger.info("autoprec.search: autoprec.profiler has no profile(); feasibility skipped.")
        return None
    try:
        return function(model, data, steps=steps, batch_size=batch_size)
    except Exception as error:  # noqa: BLE001 - a failed profile must not stop the search
        logger.warning(
            "autoprec.search: profiling failed (%s: %s); level-1 profile feasibility skipped.",
            type(error).__name__,
            error,
        )
        return None


def allowed_dtypes(
    compute: Sequence[str],
    infos: Mapping[str, LayerInfo],
    dtypes: Sequence[str],
    unsafe: Mapping[str, str],
    keep_float32: Sequence[str],
) -> tuple[dict[str, tuple[str, ...]], dict[str, dict[str, str]]]:
    """Returns `({path: allowed dtypes}, {path: {dtype: why removed}})` for the compute layers."""
    dtypes = [canonical_dtype(dtype) for dtype in dtypes]
    allowed: dict[str, tuple[str, ...]] = {}
    removed: dict[str, dict[str, str]] = {}
    for path in compute:
        reasons: dict[str, str] = {}
        if matches_any(path, infos[path], keep_float32):
            reasons.update({dtype: "keep_float32" for dtype in dtypes if dtype != FLOAT32})
        elif path in unsafe and FLOAT16 in dtypes:
            reasons[FLOAT16] = unsafe[path]
        allowed[path] = tuple(
            dtype for dtype in COMPUTE_DTYPES if dtype in dtypes and dtype not in reasons
        ) or (FLOAT32,)
        if FLOAT32 not in allowed[path]:
            allowed[path] = (FLOAT32, *allowed[path])
        if reasons:
            removed[path] = reasons
    return allowed, removed
