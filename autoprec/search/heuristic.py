"""`heuristic_plan`: 16-bit where it pays and is safe, without Optuna; and the cost view it uses."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import keras

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32
from ..cost import CostTable, estimate
from ..hardware import HardwareProfile, resolve_hardware
from ..layers import LayerInfo, describe_model
from ..plan import PrecisionPlan
from ..profiler import Profile
from .space import (
    allowed_dtypes,
    compute_layers,
    default_dtypes,
    float8_unsafe_layers,
    float16_unsafe_layers,
    is_sensitive,
    matches_any,
    output_layers,
    plan_from_assignment,
)

logger = logging.getLogger("autoprec")


class PlanCosts:
    """Predicted step time and activation memory of plans, from a cost table or (missing) nothing.

    Without a table, a plan's step time is proxied by its parameter count (16-bit
    halves it), so that the search and the heuristic still rank plans.
    """

    def __init__(self, model: keras.Model, table: CostTable | None, batch_size: int) -> None:
        self.model = model
        self.table = table
        self.batch_size = batch_size
        self._cache: dict[tuple, tuple[float, float]] = {}
        self._layer_infos: dict[str, LayerInfo] | None = None

    @property
    def available(self) -> bool:
        return self.table is not None

    @property
    def relative_error(self) -> float | None:
        """The table's whole-step prediction error (`CostTable.relative_error`), `None` without one."""
        if self.table is None:
            return None
        return float(self.table.relative_error)

    def layer_seconds(self, path: str, dtype: str) -> float | None:
        if self.table is None or path not in self.table.layers:
            return None
        try:
            return float(self.table.seconds(path, dtype, self.batch_size))
        except Exception:  # noqa: BLE001 - a dtype the table did not time
            return None

    def step(self, dtypes: Mapping[str, str]) -> tuple[float, float]:
        """Returns `(predicted step seconds, activation bytes per sample)` for `{path: dtype}`."""
        key = tuple(sorted(dtypes.items()))
        if key in self._cache:
            return self._cache[key]
        if self.table is None:
            result = self._parameter_proxy(dtypes)
        else:
            # The whole plan, containers included: a container's own arithmetic (attention
            # scores, residual adds) costs time too, in the dtype its sub-layers give it.
            plan = plan_from_assignment(self.model, self._infos(), dtypes)
            step = estimate(self.model, plan, costs=self.table, batch_size=self.batch_size)
            result = (float(step.step_seconds), float(step.activation_bytes_per_sample))
        self._cache[key] = result
        return result

    def _infos(self) -> dict[str, LayerInfo]:
        if self._layer_infos is None:
            self._layer_infos = describe_model(self.model)
        return self._layer_infos

    def _parameter_proxy(self, dtypes: Mapping[str, str]) -> tuple[float, float]:
        infos = self._infos()
        factor = {FLOAT32: 1.0, BFLOAT16: 0.5, FLOAT16: 0.5, FLOAT8: 0.25}
        total = sum(
            (infos[path].parameters + 1) * factor[dtype]
            for path, dtype in dtypes.items()
            if path in infos
        )
        return total * 1e-9, total


def heuristic_plan(
    model: keras.Model,
    profile: Profile | None = None,
    *,
    costs: CostTable | None = None,
    hardware: HardwareProfile | str = "local",
    dtypes: Sequence[str] | None = None,
    keep_float32: Sequence[str] = (),
    check: Callable[[PrecisionPlan], bool] | None = None,
) -> PrecisionPlan:
    """Returns a plan that puts layers in 16-bit where it pays and is safe, without Optuna.

    Each compute layer gets its cheapest allowed reduced dtype (from the cost table, else
    bfloat16 where the hardware runs it fast, else float16) when that is faster than
    float32; float16 is never used where the profile says the layer's ranges do not fit.
    On hardware with FP8 tensor cores, a Dense/EinsumDense layer gets float8 when the
    cost table predicts its three matrix products plus the quantize work faster than
    its best 16-bit dtype, and the profile's float8 ranges (flush-to-zero and
    saturation after per-tensor scaling, amax growth) fit; narrow and launch-bound
    layers stay 16-bit because float8 is predicted slower there.
    Softmax, normalisation and the model's output layers stay float32. With `check`, the
    demotions are tried greedily by benefit, and a failing set is bisected (as
    onnxconverter-common's auto mixed precision does) until only the layers whose
    demotion breaks `check` stay float32.

    With a cost table, a predicted gain inside the prediction's own error
    (`CostTable.relative_error`, measured by `calibrate`, 10 % for a prediction)
    is no gain: a layer is demoted only when its 16-bit time is predicted faster
    than its float32 time by more than that fraction of it, and the whole plan is
    float32 unless a uniform 16-bit plan, or then the per-layer plan, is predicted
    faster than the simpler choice by more than that fraction of its step (casts
    and boundary costs included). The decision and its reason are logged
    (`"autoprec"` logger, INFO).

    Args:
        model: a built Keras model.
        profile: an `autoprec.profiler.Profile` (float16 feasibility), or `None`.
        costs: an `autoprec.cost.CostTable` (benefit of each demotion), or `None`
            (benefit: parameter count).
        hardware: `"local"` (this device, detected), a profile name such as
            `"rtx4090"` or a `HardwareProfile`; its slow 16-bit dtypes are not used
            unless listed in `dtypes`.
        dtypes: dtypes allowed (default: float32 plus the hardware's fast 16-bit
            dtypes).
        keep_float32: globs on layer paths or class names kept in float32, in
            addition to the default protections (softmax, normalisation and the
            model's output layers).
        check: optional `plan -> bool` (e.g. a quick accuracy test); enables bisection.

    Returns:
        A `PrecisionPlan`.

    Example:

    ```python
    plan = autoprec.heuristic_plan(model, hardware="rtx4090")
    model.fit(x, y, callbacks=[autoprec.AutoPrecision(plan)])
    ```
    """
    infos = describe_model(model)
    hardware_profile = resolve_hardware(hardware)
    dtypes = default_dtypes(dtypes, hardware_profile, None)
    compute = compute_layers(infos)
    unsafe = float16_unsafe_layers(profile)
    keep = list(keep_float32)
    outputs = output_layers(model, infos)
    allowed, removed = allowed_dtypes(
        compute,
        infos,
        dtypes,
        unsafe,
        keep,
        float8_unsafe=float8_unsafe_layers(profile),
        outputs=outputs,
    )
    _log_float8_refusals(removed)
    batch_size = (costs.batch_size if costs is not None else None) or 32
    cost_view = PlanCosts(model, costs, batch_size)
    margin = cost_view.relative_error
    eligible = [
        path
        for path in compute
        if path not in outputs
        and not is_sensitive(infos[path])
        and not (keep and matches_any(path, infos[path], keep))
    ]
    demoted = _ranked_demotions(eligible, infos, allowed, cost_view, hardware_profile)
    base = {path: FLOAT32 for path in compute}
    if cost_view.available:
        demoted = _fastest_whole_plan(demoted, eligible, allowed, base, cost_view, margin or 0.0)
    if check is not None:
        demoted = _bisect_demotions(demoted, base, model, infos, check)
    assignment = dict(base)
    assignment.update(dict(demoted))
    return plan_from_assignment(model, infos, assignment)


def _ranked_demotions(
    eligible: Sequence[str],
    infos: dict[str, LayerInfo],
    allowed: dict[str, Sequence[str]],
    cost_view: PlanCosts,
    hardware_profile: HardwareProfile,
) -> list[tuple[str, str]]:
    """Returns `(path, dtype)` of each layer whose best 16-bit dtype gains beyond the error, best first."""
    margin = cost_view.relative_error
    candidates = []
    within_error: list[tuple[str, float, float]] = []
    for path in eligible:
        choice, benefit, reference = _best_half(
            path, infos[path], allowed[path], cost_view, hardware_profile
        )
        if choice is None or benefit <= 0:
            continue
        if margin is not None and benefit <= margin * reference:
            within_error.append((path, benefit, reference))
            continue
        candidates.append((benefit, path, choice))
    if within_error:
        _log_within_error(within_error, margin)
    candidates.sort(key=lambda item: (-item[0], item[1]))
    return [(path, choice) for _, path, choice in candidates]


def _best_half(
    path: str,
    info: LayerInfo,
    allowed: Sequence[str],
    costs: PlanCosts,
    hardware_profile: HardwareProfile | None,
) -> tuple[str | None, float, float]:
    """Returns `(cheapest 16-bit dtype, its benefit, the float32 figure the benefit is of)`.

    With a cost table, the benefit and the reference are seconds (float32 minus
    16-bit, and float32); without one, both are the parameter count.
    """
    halves = [dtype for dtype in (BFLOAT16, FLOAT16) if dtype in allowed]
    if costs.available and FLOAT8 in allowed:
        halves.append(FLOAT8)  # float8 only where its cost is known: shapes decide whether it pays
    if not halves:
        return None, 0.0, 0.0
    if costs.available:
        float32_seconds = costs.layer_seconds(path, FLOAT32)
        timed = [(costs.layer_seconds(path, dtype), dtype) for dtype in halves]
        timed = [(seconds, dtype) for seconds, dtype in timed if seconds is not None]
        if float32_seconds is None or not timed:
            return None, 0.0, 0.0
        seconds, dtype = min(timed)
        return dtype, float32_seconds - seconds, float32_seconds
    if hardware_profile is not None:
        fast = [dtype for dtype in halves if hardware_profile.is_fast(dtype)]
        halves = fast or halves
    return halves[0], float(info.parameters + 1), float(info.parameters + 1)


def _log_float8_refusals(removed: Mapping[str, Mapping[str, str]]) -> None:
    """Logs the Dense/EinsumDense layers that float8 is refused for, and why."""
    refused = {path: why[FLOAT8] for path, why in removed.items() if FLOAT8 in why}
    for path, reason in list(refused.items())[:8]:
        logger.info("autoprec.heuristic: %s gets no float8: %s", path, reason)


def _log_within_error(within_error: Sequence[tuple[str, float, float]], margin: float) -> None:
    """Logs the layers kept in float32 because their predicted gain is inside the error."""
    shown = sorted(within_error, key=lambda item: -item[1])[:8]
    logger.info(
        "autoprec.heuristic: %d layer(s) stay float32: each one's predicted 16-bit gain is "
        "within the prediction's error (+/-%.1f%% of its float32 time): %s%s",
        len(within_error),
        margin * 100,
        ", ".join(
            f"{path} ({benefit * 1e3:.3f} of {reference * 1e3:.3f} ms)"
            for path, benefit, reference in shown
        ),
        ", ..." if len(within_error) > len(shown) else "",
    )


def _fastest_whole_plan(
    per_layer: list[tuple[str, str]],
    eligible: Sequence[str],
    allowed: Mapping[str, Sequence[str]],
    base: Mapping[str, str],
    costs: PlanCosts,
    margin: float = 0.0,
) -> list[tuple[str, str]]:
    """Returns the demotions of the whole plan to use: float32, a uniform 16-bit dtype, or
    the per-layer choices.

    Per-layer timings miss what only the whole step shows (casts between
    neighbours, boundary costs, a dtype's fixed overhead), so the per-layer
    choice is compared with the uniform alternatives on the predicted whole
    step. The simpler plan wins unless a more complex one (in the order float32,
    uniform bfloat16, uniform float16, float8 wherever allowed with bfloat16 elsewhere,
    per-layer) is predicted faster than it by more than `margin` (the prediction's
    relative error) of its step.
    """
    options: dict[str, list[tuple[str, str]]] = {"float32": []}
    for dtype in (BFLOAT16, FLOAT16):
        uniform = [(path, dtype) for path in eligible if dtype in allowed.get(path, ())]
        if uniform:
            options[f"uniform {dtype}"] = uniform
    float8 = [
        (path, FLOAT8 if FLOAT8 in allowed.get(path, ()) else BFLOAT16)
        for path in eligible
        if FLOAT8 in allowed.get(path, ()) or BFLOAT16 in allowed.get(path, ())
    ]
    if any(dtype == FLOAT8 for _, dtype in float8):
        options["float8 where allowed"] = float8  # the rest bfloat16, as float8_from_mixed_bfloat16
    if per_layer and all(dict(per_layer) != dict(other) for other in options.values()):
        options["per-layer"] = per_layer

    def seconds(demotions: list[tuple[str, str]]) -> float:
        assignment = dict(base)
        assignment.update(dict(demotions))
        return costs.step(assignment)[0]

    timed = {name: seconds(demotions) for name, demotions in options.items()}
    best = "float32"
    for name in options:
        if timed[name] < timed[best] * (1.0 - margin):
            best = name
    reference = timed["float32"] if timed["float32"] > 0 else 1.0
    if best == "float32":
        reason = (
            f"no other plan is predicted faster than float32 by more than the prediction's "
            f"error (+/-{margin:.1%})"
        )
    else:
        reason = (
            f"predicted {1.0 - timed[best] / reference:.1%} faster than float32, beyond the "
            f"prediction's error (+/-{margin:.1%}), and no more complex plan beats it by more"
        )
    logger.info(
        "autoprec.heuristic: predicted step %s; using %s: %s",
        ", ".join(
            f"{name} {value * 1e3:.2f} ms ({value / reference - 1.0:+.1%})"
            for name, value in timed.items()
        ),
        best,
        reason,
    )
    return options[best]


def _bisect_demotions(
    demoted: list[tuple[str, str]],
    base: dict[str, str],
    model: keras.Model,
    infos: Mapping[str, LayerInfo],
    check: Callable[[PrecisionPlan], bool],
) -> list[tuple[str, str]]:
    accepted: list[tuple[str, str]] = []

    def passes(extra: list[tuple[str, str]]) -> bool:
        assignment = dict(base)
        assignment.update(dict(accepted + extra))
        return bool(check(plan_from_assignment(model, infos, assignment)))

    def visit(subset: list[tuple[str, str]]) -> None:
        if not subset:
            return
        if passes(subset):
            accepted.extend(subset)
            return
        if len(subset) == 1:
            logger.info("autoprec.heuristic: %s stays float32 (its demotion fails)", subset[0][0])
            return
        middle = len(subset) // 2
        visit(subset[:middle])
        visit(subset[middle:])

    visit(demoted)
    return accepted
