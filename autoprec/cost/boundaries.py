"""Dtype boundaries: the mixed plans `calibrate` times whole, and what a boundary costs a step."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import keras

from .._core.dtypes import FLOAT32, canonical_dtype
from ..layers import is_graph_model, layer_paths
from .estimate import estimate
from .table import DEFAULT_RELATIVE_ERROR, CostTable

#: Lowest `CostTable.relative_error` a calibration reports: one held-out plan does not
#: vouch for every plan to better than this.
MIN_RELATIVE_ERROR = 0.02

#: The patterns of `mixed_plans`: every other layer with weights in 16-bit, or the first half.
PATTERNS = ("alternating", "half")


@dataclasses.dataclass(frozen=True)
class MixedPlan:
    """A mixed-dtype plan whose whole step `calibrate` times."""

    name: str
    dtype: str
    pattern: str
    dtypes: Mapping[str, str]


def _units(paths: Mapping[str, keras.layers.Layer]) -> dict[str, str]:
    """Returns `{path: unit path}`: the outermost layer around it that is not a graph model."""
    units = {}
    for path in paths:
        parts = path.split("/")
        unit = path
        for depth in range(1, len(parts)):
            prefix = "/".join(parts[:depth])
            if prefix in paths and not is_graph_model(paths[prefix]):
                unit = prefix
                break
        units[path] = unit
    return units


def mixed_assignment(model: keras.Model, dtype: str, pattern: str) -> dict[str, str]:
    """Returns `{path: dtype}` of every layer of `model` under one mixed pattern."""
    if pattern not in PATTERNS:
        raise ValueError(f"mixed_assignment: pattern {pattern!r} is not one of {PATTERNS}.")
    dtype = canonical_dtype(dtype, "mixed_assignment")
    paths = layer_paths(model)
    units = _units(paths)
    order = list(dict.fromkeys(units[path] for path in paths if not is_graph_model(paths[path])))
    weighted = [unit for unit in order if paths[unit].weights]
    chosen: dict[str, str] = {}
    if len(weighted) >= 2:
        for index, unit in enumerate(weighted):
            if pattern == "alternating":
                in_half = index % 2 == 0
            else:
                in_half = index < len(weighted) // 2
            chosen[unit] = dtype if in_half else FLOAT32
    current, unit_dtype = FLOAT32, {}
    for unit in order:
        current = chosen.get(unit, current)
        unit_dtype[unit] = current
    assignment = {}
    for path, layer in paths.items():
        if is_graph_model(layer):
            first = next(
                (
                    other
                    for other in paths
                    if other.startswith(path + "/") and not is_graph_model(paths[other])
                ),
                None,
            )
            assignment[path] = unit_dtype[units[first]] if first is not None else FLOAT32
        else:
            assignment[path] = unit_dtype[units[path]]
    return assignment


def mixed_plans(model: keras.Model, dtypes: Sequence[str]) -> dict[str, MixedPlan]:
    """Returns the mixed plans `calibrate` times: alternating per dtype, half for the first."""
    plans: dict[str, MixedPlan] = {}
    halves = [canonical_dtype(dtype) for dtype in dtypes if canonical_dtype(dtype) != FLOAT32]
    for position, dtype in enumerate(halves):
        alternating = mixed_assignment(model, dtype, "alternating")
        if all(value == FLOAT32 for value in alternating.values()):
            return {}
        plans[f"alternating {dtype}"] = MixedPlan(
            f"alternating {dtype}", dtype, "alternating", alternating
        )
        half = mixed_assignment(model, dtype, "half")
        if position == 0 and half != alternating:
            plans[f"half {dtype}"] = MixedPlan(f"half {dtype}", dtype, "half", half)
    return plans


def boundaries(table: CostTable, dtypes: Mapping[str, str]) -> list[tuple[str, int]]:
    """Returns `(16-bit dtype, elements per sample)` of each boundary between two layers."""
    found = []
    for producer, consumer, elements in table.edges:
        if producer is None:
            continue
        source, target = dtypes.get(producer, FLOAT32), dtypes.get(consumer, FLOAT32)
        if source != target:
            found.append((target if target != FLOAT32 else source, int(elements)))
    return found


def _fit_one(table: CostTable, plan: MixedPlan, residual: float) -> dict[str, float]:
    """Returns the boundary figures that make `plan`'s step `residual` seconds longer."""
    crossing = [
        elements * table.batch_size
        for dtype, elements in boundaries(table, plan.dtypes)
        if dtype == plan.dtype
    ]
    if not crossing:
        return {"fixed": 0.0, "per_element": 0.0}
    cast = table.cast_seconds.get(plan.dtype) or {}
    fixed, per_element = 2.0 * cast.get("fixed", 0.0), 2.0 * cast.get("per_element", 0.0)
    shape = sum(fixed + per_element * elements for elements in crossing)
    if shape <= 0:
        return {"fixed": max(residual, 0.0) / len(crossing), "per_element": 0.0}
    factor = max(residual / shape, -1.0)
    return {"fixed": factor * fixed, "per_element": factor * per_element}


def fit_boundary_cost(
    model: keras.Model,
    table: CostTable,
    plans: Mapping[str, MixedPlan],
    measured: Mapping[str, float],
    noise: float | None = None,
) -> None:
    """Learns `table.boundary_seconds` from measured mixed steps and sets `relative_error`."""
    runs = {name: plans[name] for name in measured if name in plans and measured[name] > 0}
    table.boundary_seconds = {}
    table.measured_plan_seconds = {name: float(measured[name]) for name in runs}
    errors: dict[str, float] = {}

    def predicted(plan: MixedPlan) -> float:
        return float(estimate(model, dict(plan.dtypes), costs=table).step_seconds)

    before = {name: predicted(plan) for name, plan in runs.items()}
    for name in runs:
        errors[f"{name}, no boundary cost"] = before[name] / measured[name] - 1.0
    fitted = {}
    for name, plan in runs.items():
        if plan.pattern != "alternating":
            continue
        # A residual inside the noise of the rounds teaches nothing about boundaries: the
        # dtype's boundaries then cost nothing beyond their casts (not the other dtypes' figures).
        residual = measured[name] - before[name]
        if noise is not None and abs(before[name] / measured[name] - 1.0) <= noise:
            residual = 0.0
        fitted[plan.dtype] = _fit_one(table, plan, residual)
    table.boundary_seconds = fitted
    for name, plan in runs.items():
        errors[name] = predicted(plan) / measured[name] - 1.0
    held_out = any(plan.pattern != "alternating" for plan in runs.values())
    floor = MIN_RELATIVE_ERROR if held_out else DEFAULT_RELATIVE_ERROR
    checks = [abs(errors[name]) for name in runs]
    if noise is not None:
        errors["noise"] = float(noise)
        checks.append(float(noise))
    table.relative_error = float(max([floor, *checks]))
    table.prediction_errors = errors
