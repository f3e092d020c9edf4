"""The plan check: each layer (and a subclassed model's own `call`) run in its planned dtypes before
training, and what cannot run moved to a dtype that does."""

from __future__ import annotations

import bisect
import dataclasses
import logging
import weakref
from collections.abc import Mapping, Sequence

import keras

from .._core.dtypes import FLOAT8, FLOAT32, POLICY_FOR_DTYPE, dtype_of_policy
from ..cost import ModelTrace
from ..layers import describe_model, layer_paths, layer_policy
from ..plan import PrecisionPlan
from .check import (
    CHECK_FAILED,
    MISSING_KERNEL,
    MIXED_ARITHMETIC,
    MissingKernel,
    check_layer,
    check_own_call,
    needs_own_call_check,
    subtree,
    trace_for_check,
)
from .policy_map import lists_own_layers, unnamed_layer_dtypes

logger = logging.getLogger("autoprec")

#: `{model: {key: MissingKernel or None}}`: the layers checked on each model, a key being
#: the layer's path and dtype with its sub-layers' (`_check_keys`).
_CHECKED_KERNELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def find_missing_kernels(
    model: keras.Model,
    dtypes: Mapping[str, str],
    trace: ModelTrace | None = None,
    planned: Mapping[str, str] | None = None,
) -> list[MissingKernel]:
    """Returns the layers that cannot run forward and backward in their planned dtype here,
    each called alone, innermost first (see docs/api.md)."""
    current = {**(planned or {}), **dtypes}
    if all(dtype == FLOAT32 for dtype in current.values()):
        return []
    if trace is None:
        trace = trace_for_check(model)
        if trace is None:
            return []
    infos = describe_model(model)
    paths = layer_paths(model)
    missing = []
    for path in sorted(dtypes, key=lambda path: path.count("/"), reverse=True):
        info = infos.get(path)
        calls = trace.calls.get(path, ())
        if info is None or info.pass_through or not calls:
            continue
        if info.is_container and info.follows is not None:
            continue  # a nested model: its layers are checked one by one
        found = check_layer(paths, path, calls[0], current)
        if found is None:
            continue
        if found.kind == CHECK_FAILED:
            logger.info(
                "autoprec: kernel check could not call %s alone (%s); its dtype is unchanged",
                path,
                found.error,
            )
        else:  # as `plan.with_dtype` sets it
            current.update(dict.fromkeys(subtree(paths, path), found.fallback))
        missing.append(found)
    return missing


def _check_keys(dtypes: Mapping[str, str]) -> dict[str, tuple]:
    """Returns `{path: key}` of the layers to check: the layer with its sub-layers' dtypes."""
    ordered = sorted(dtypes)
    keys = {}
    for path, dtype in dtypes.items():
        if dtype not in POLICY_FOR_DTYPE:
            continue
        prefix = path + "/"
        inner = []
        for other in ordered[bisect.bisect_left(ordered, prefix) :]:
            if not other.startswith(prefix):
                break
            inner.append((other, dtypes[other]))
        if dtype != FLOAT32 or any(value not in (FLOAT32, FLOAT8) for _, value in inner):
            keys[path] = (path, dtype, tuple(inner))
    return keys


def unchecked_kernels(model: keras.Model, dtypes: Mapping[str, str]) -> dict[str, str]:
    """Returns the `{path: dtype}` of `dtypes` not checked on `model` yet (sub-layers' included)."""
    checked = _CHECKED_KERNELS.get(model, {})
    return {path: dtypes[path] for path, key in _check_keys(dtypes).items() if key not in checked}


def missing_kernels_once(model: keras.Model, dtypes: Mapping[str, str]) -> list[MissingKernel]:
    """Returns the `find_missing_kernels` findings that change `dtypes`, checking each layer
    (with its sub-layers' dtypes) once per model."""
    checked = _CHECKED_KERNELS.setdefault(model, {})
    keys = _check_keys(dtypes)
    unchecked = {path: dtypes[path] for path, key in keys.items() if key not in checked}
    if unchecked:
        found = {item.path: item for item in find_missing_kernels(model, unchecked, planned=dtypes)}
        for path in unchecked:
            checked[keys[path]] = found.get(path)
    findings = [checked.get(key) for key in keys.values()]
    findings = [item for item in findings if item is not None and item.kind != CHECK_FAILED]
    return findings + _own_call_findings(model, dtypes, findings, checked)


def _own_call_findings(
    model: keras.Model,
    dtypes: Mapping[str, str],
    findings: Sequence[MissingKernel],
    checked: dict,
) -> list[MissingKernel]:
    """A subclassed model's own call, with its layers where their checks left them."""
    after = dict(dtypes)
    for item in sorted(findings, key=lambda found: found.path.count("/")):
        after.update(dict.fromkeys(subtree(after, item.path), item.fallback))
    if not needs_own_call_check(model, after):
        return []
    key = ("", tuple(sorted(after.items())))
    if key not in checked:
        checked[key] = check_own_call(model, after)
    found = checked[key]
    if found is None:
        return []
    infos = describe_model(model)
    return [
        dataclasses.replace(found, path=path, dtype=dtype)
        for path, dtype in after.items()
        if "/" not in path
        and path in infos
        and infos[path].follows is None
        and any(value != found.fallback for value in subtree(after, path).values())
    ]


_MESSAGES = {
    MISSING_KERNEL: "autoprec: %s has no %s kernel here (%s); it runs in %s",
    MIXED_ARITHMETIC: "autoprec: %s cannot run in %s as planned (%s); it runs in %s",
}
_OTHER_MESSAGE = "autoprec: %s fails in %s alone but runs in float32 (%s); it runs in %s"


def fallback_plan(
    plan: PrecisionPlan,
    missing: Sequence[MissingKernel],
    step: int = 0,
    logged: set[tuple[str, ...]] | None = None,
) -> PrecisionPlan:
    """Returns `plan` with each failing layer and its sub-layers moved to its fallback dtype, each
    change an event and a warning (once per finding in `logged`)."""
    logged = set() if logged is None else logged
    for item in missing:
        if item.kind == CHECK_FAILED:
            continue  # the check could not tell: the plan stays as it is
        event = {
            "step": step,
            "kind": item.kind,
            "layer": item.path,
            "from": item.dtype,
            "to": item.fallback,
            "evidence": item.error,
        }
        plan = plan.with_dtype(item.path, item.fallback).with_event(event)
        key = (item.path, item.dtype, item.fallback, item.kind)
        if key not in logged:
            logged.add(key)
            message = _MESSAGES.get(item.kind, _OTHER_MESSAGE)
            logger.warning(message, item.path, item.dtype, item.error, item.fallback)
    return plan


#: Rounds of check and fallback `checked_plan` runs at most (a fallback can change the
#: dtype unnamed layers take, and so what the next round checks).
CHECK_ROUNDS = 4


def checked_plan(
    model: keras.Model,
    plan: PrecisionPlan,
    step: int = 0,
    logged: set[tuple[str, ...]] | None = None,
) -> PrecisionPlan:
    """Returns `plan` with every layer that cannot run as planned here moved to what it runs in,
    checked again until nothing changes."""
    paths = layer_paths(model)
    kept = {  # Keras rebuilds these in their own policy: apply_plan leaves it
        path: dtype_of_policy(layer_policy(layer))
        for path, layer in paths.items()
        if lists_own_layers(layer)
    }
    for _ in range(CHECK_ROUNDS):
        dtypes = {**plan.resolve(), **kept}
        dtypes.update(unnamed_layer_dtypes(model, dtypes))
        missing = missing_kernels_once(model, dtypes)
        fallen = fallback_plan(plan, missing, step=step, logged=logged) if missing else plan
        if fallen.resolve() == plan.resolve():
            break
        plan = fallen
    return plan
