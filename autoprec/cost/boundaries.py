"""Dtype boundaries: the mixed plans `calibrate` times whole, and what a boundary costs a step.

Per-layer timings miss what a whole step pays where two layers of different
dtypes meet: beyond the cast timed alone, the lost fusion, layout changes and
the dispatch of the extra ops. `mixed_plans` builds the plans that show it (16-bit
and float32 alternating among the layers with weights: many boundaries; the first
half 16-bit: one or two), `calibrate` times them beside the uniform steps, and
`fit_boundary_cost` turns the difference between the measured and the predicted
alternating step into the table's `boundary_seconds`, then checks the fit on
the half-and-half step, which it did not use: that check, with the noise of the
measurements, is the table's `relative_error`.
"""

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
    """A mixed-dtype plan whose whole step `calibrate` times.

    Attributes:
        name: `"<pattern> <dtype>"`, e.g. `"alternating bfloat16"`; keys
            `CostTable.measured_plan_seconds`.
        dtype: the 16-bit dtype of the plan's 16-bit layers.
        pattern: `"alternating"` (fitted) or `"half"` (held out to check the fit).
        dtypes: `{path: dtype}` of every layer of the model (containers included),
            as `clone_with_policies` applies it and `estimate` reads it.
    """

    name: str
    dtype: str
    pattern: str
    dtypes: Mapping[str, str]


def _units(paths: Mapping[str, keras.layers.Layer]) -> dict[str, str]:
    """Returns `{path: unit path}`: the outermost layer around it that is not a graph model.

    A composite layer (MultiHeadAttention, a keras-hub TransformerEncoder) is one
    unit: its sub-layers get one dtype, so that no plan breaks a layer adding
    its sub-layers' outputs in its own `call`.
    """
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
    """Returns `{path: dtype}` of every layer of `model` under one mixed pattern.

    The units with weights (a layer, or a composite layer with its sub-layers)
    take `dtype` and float32 in turn (`"alternating"`, the first one in `dtype`)
    or `dtype` for the first half of them (`"half"`); a unit without weights
    takes the dtype of the last unit with weights before it (float32 before the
    first); a nested Functional or Sequential model takes its first layer's.

    Args:
        model: the model (Functional, Sequential or subclassed).
        dtype: the 16-bit dtype.
        pattern: `"alternating"` or `"half"`.

    Returns:
        The assignment (float32 everywhere when the model has fewer than two
        units with weights).

    Raises:
        ValueError: if `pattern` is not one of `PATTERNS`.

    Example:

    ```python
    mixed_assignment(model, "bfloat16", "alternating")  # {"dense": "bfloat16", "dense_1": ...}
    ```
    """
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
    """Returns the mixed plans `calibrate` times: alternating per dtype, half for the first.

    Args:
        model: the model.
        dtypes: the 16-bit dtypes (float32 is skipped), in order of preference.

    Returns:
        `{name: MixedPlan}`: `"alternating <dtype>"` for each dtype and `"half
        <dtype>"` for the first one (the held-out check of the fit); none when the
        model has fewer than two units with weights, and no half plan where it
        equals the alternating one.

    Example:

    ```python
    list(mixed_plans(model, ["bfloat16"]))  # ["alternating bfloat16", "half bfloat16"]
    ```
    """
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
    """Returns `(16-bit dtype, elements per sample)` of each boundary between two layers.

    A boundary is an edge of `table.edges` between two layers (not a model input)
    whose dtypes differ under `dtypes`; its dtype is the 16-bit side's (the
    consumer's when both are 16-bit), as `estimate` counts casts.

    Args:
        table: the cost table (its edges).
        dtypes: `{path: dtype}` naming every layer the edges touch (float32 elsewhere).

    Returns:
        One entry per boundary.

    Example:

    ```python
    len(boundaries(table, mixed_assignment(model, "bfloat16", "alternating")))
    ```
    """
    found = []
    for producer, consumer, elements in table.edges:
        if producer is None:
            continue
        source, target = dtypes.get(producer, FLOAT32), dtypes.get(consumer, FLOAT32)
        if source != target:
            found.append((target if target != FLOAT32 else source, int(elements)))
    return found


def _fit_one(table: CostTable, plan: MixedPlan, residual: float) -> dict[str, float]:
    """Returns the boundary figures that make `plan`'s step `residual` seconds longer.

    The residual is spread over the plan's boundaries in proportion to their
    casts timed alone (evenly when no cast was timed); a negative residual (the
    casts cost less inside the step than alone) takes off at most the casts
    themselves: a boundary never makes a step faster.
    """
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
    """Learns `table.boundary_seconds` from measured mixed steps and sets `relative_error`.

    For each measured alternating plan, the residual (measured step minus the
    step `estimate` predicts with no boundary cost) is spread over its
    boundaries of that dtype in proportion to the casts timed alone (fixed +
    per element, forward and backward): each boundary then costs the whole step
    `k` times its cast more, with `k` fitted so that the alternating step's
    estimate equals its measurement. `k` is at least -1 (a boundary whose casts
    cost less inside the step than alone costs at least nothing: it never makes
    a step faster); when no cast was timed, a positive residual is spread evenly
    over the boundaries. A residual smaller than `noise` (as a fraction of the
    step) is not fitted: the spread of the rounds explains it as well. A dtype
    with no alternating step of its own takes the mean of the others'
    (`CostTable.boundary_cost`).

    `table.relative_error` is then the largest of `noise`, `MIN_RELATIVE_ERROR`
    and `|predicted / measured - 1|` of every measured mixed step after the fit;
    the half-and-half steps were not used by the fit, so theirs is a held-out
    error. Without a half-and-half step it is the largest of `noise` and
    `DEFAULT_RELATIVE_ERROR` (and the alternating steps' errors). The signed
    errors, before and after the boundary cost, go to `table.prediction_errors`.

    Args:
        model: the model the table is for.
        table: the measured table, its uniform steps already attributed
            (`attribute_step_overhead`); updated in place.
        plans: the plans timed (`mixed_plans`).
        measured: `{plan name: measured whole-step seconds}` of those that ran.
        noise: the relative spread of the measured steps' timed rounds
            (`steps.WholeSteps.noise`), or `None` when unknown.

    Example:

    ```python
    plans = mixed_plans(model, ["bfloat16"])
    fit_boundary_cost(model, table, plans, {"alternating bfloat16": 0.052}, noise=0.01)
    table.boundary_seconds["bfloat16"], table.relative_error
    ```
    """
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
