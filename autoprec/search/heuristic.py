"""`heuristic_plan`: uniform first, then layers depart from it only on evidence."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

import keras

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32, count_dtypes, counts_text, widen
from ..cost import CostTable
from ..hardware import HardwareProfile, resolve_hardware
from ..layers import LayerInfo, describe_model
from ..plan import PrecisionPlan
from ..profiler import Profile
from .budget import rounding_floor_outputs
from .space import (
    PlanCosts,
    allowed_dtypes,
    compute_layers,
    default_dtypes,
    float8_unsafe_layers,
    float16_unsafe_layers,
    group_layers,
    output_layers,
    plan_from_assignment,
    with_loss_scale_start,
)

#: The most moves `cost_departures` prices on the whole step (best layer gain first).
MAX_PRICED_MOVES = 96


@dataclasses.dataclass(frozen=True)
class Departure:
    """One layer's move off the plan's uniform start, and the evidence for it."""

    path: str
    start: str
    dtype: str
    kind: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        """Returns the entry kept in `plan.metadata["evidence"][path]`."""
        return {"kind": self.kind, "from": self.start, "dtype": self.dtype, "reason": self.reason}


@dataclasses.dataclass(frozen=True)
class Feasibility:
    """What each compute layer may take: allowed dtypes, why others were removed, output floors."""

    compute: tuple[str, ...]
    allowed: Mapping[str, tuple[str, ...]]
    removed: Mapping[str, Mapping[str, str]]
    floors: Mapping[str, str]
    unsafe: Mapping[str, str] = dataclasses.field(default_factory=dict)  # float16's, and why
    outputs: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class Start:
    """The policy a plan starts from, and the predicted step of each policy weighed."""

    dtype: str
    assignment: Mapping[str, str]
    departures: tuple[Departure, ...]
    step_seconds: Mapping[str, float]
    uniform: Mapping[str, Mapping[str, str]]

    def to_dict(self, source: str) -> dict[str, object]:
        """Returns `plan.metadata["start"]`: the policy, each one's predicted step, the costs'
        source."""
        return {
            "policy": self.dtype,
            "predicted_step_ms": {
                dtype: round(seconds * 1e3, 4) for dtype, seconds in self.step_seconds.items()
            },
            "costs": source,
        }


def cost_source(table: CostTable | None, hardware: HardwareProfile) -> str:
    """Says where a cost table's figures come from: `"predicted for rtx4090"`, `"measured on ..."`."""
    if table is None:
        return "no cost table (parameter counts)"
    if str(table.source).startswith("predicted"):
        return f"predicted for {hardware.name}"
    return f"measured on {hardware.name}"


def ladder_assignment(dtype: str, feasibility: Feasibility) -> tuple[dict, tuple[Departure, ...]]:
    """Returns `dtype` on every compute layer, each layer that may not take it widened."""
    assignment: dict[str, str] = {}
    departures: list[Departure] = []
    for path in feasibility.compute:
        allowed = feasibility.allowed[path]
        if dtype != FLOAT32 and path in feasibility.floors:
            chosen, kind, why = FLOAT32, "budget", feasibility.floors[path]
        elif dtype in allowed:
            assignment[path] = dtype
            continue
        else:
            chosen = widen(dtype, tuple(d for d in allowed if d != FLOAT8))
            why = feasibility.removed.get(path, {}).get(dtype, f"{dtype} not allowed here")
            kind = "user" if why == "keep_float32" else "range"
        assignment[path] = chosen
        departures.append(Departure(path, dtype, chosen, kind, why))
    return assignment, tuple(departures)


def choose_start(
    feasibility: Feasibility,
    dtypes: Sequence[str],
    hardware: HardwareProfile,
    costs: PlanCosts,
) -> Start:
    """Returns the fastest policy among float32 and each 16-bit dtype in `dtypes`."""
    options = {FLOAT32: ladder_assignment(FLOAT32, feasibility)}
    for dtype in (BFLOAT16, FLOAT16):
        if dtype in dtypes:
            options[dtype] = ladder_assignment(dtype, feasibility)
    uniform = {
        dtype: assignment
        for dtype, (assignment, departures) in options.items()
        if not any(departure.kind == "range" for departure in departures)
    }
    if costs.available:
        seconds = {dtype: costs.step(assignment)[0] for dtype, (assignment, _) in options.items()}
        best = min(options, key=lambda dtype: (seconds[dtype], dtype != FLOAT32))
    else:
        seconds = {}
        reduced = [dtype for dtype in options if dtype != FLOAT32]
        fast = [dtype for dtype in reduced if hardware.is_fast(dtype)]
        best = (fast or reduced or [FLOAT32])[0]
    assignment, departures = options[best]
    return Start(best, assignment, departures, seconds, uniform)


def cost_departures(
    assignment: Mapping[str, str],
    departures: dict[str, Departure],
    feasibility: Feasibility,
    costs: PlanCosts,
    start: str,
    source: str,
) -> dict[str, str]:
    """Moves layers (and blocks) to a dtype they are faster in, where the whole step gains too."""
    margin = costs.relative_error or 0.0
    result = dict(assignment)
    moves = _priced_moves(result, feasibility, costs, margin)
    current = costs.step(result)[0]
    for _, members, dtype, label in moves[:MAX_PRICED_MOVES]:
        members = [member for member in members if result[member] != dtype]
        if not members:
            continue
        before = {member: result[member] for member in members}
        trial = dict(result)
        trial.update(dict.fromkeys(members, dtype))
        seconds = costs.step(trial)[0]
        if seconds >= current:
            continue
        old = ", ".join(sorted(set(before.values())))
        why = (
            f"{source}: {label} {_layer_ms(members, before, costs)} ms in {old}, "
            f"{_layer_ms(members, dict.fromkeys(members, dtype), costs)} ms in {dtype} "
            f"(beyond the +/-{margin:.0%} error); whole step {current * 1e3:.3f} -> "
            f"{seconds * 1e3:.3f} ms, casts included"
        )
        kind = "float8" if dtype == FLOAT8 else "cost"
        for member in members:
            departures[member] = Departure(member, start, dtype, kind, why)
        result, current = trial, seconds
    return result


def _layer_ms(members: Sequence[str], dtypes: Mapping[str, str], costs: PlanCosts) -> str:
    """The members' summed layer time in their given dtypes, in milliseconds, as text."""
    total = sum(costs.layer_seconds(member, dtypes[member]) or 0.0 for member in members)
    return f"{total * 1e3:.3f}"


def _priced_moves(
    assignment: Mapping[str, str], feasibility: Feasibility, costs: PlanCosts, margin: float
) -> list[tuple[float, list[str], str, str]]:
    """Returns `(gain seconds, members, dtype, label)` of each move beyond the error, best first."""
    moves = []
    blocks = [block for block in group_layers(list(feasibility.compute), "block") if len(block) > 1]
    for block in blocks:
        for dtype in (FLOAT32, BFLOAT16, FLOAT16):
            members = [path for path in block if _may_move(path, dtype, feasibility)]
            gain, now = _gain(members, assignment, dtype, costs)
            if members and gain > margin * now > 0:
                label = f"block {members[0]} .. {members[-1]} ({len(members)} layers)"
                moves.append((gain, members, dtype, label))
    for path in feasibility.compute:
        for dtype in feasibility.allowed[path]:
            if dtype == assignment[path] or not _may_move(path, dtype, feasibility):
                continue
            gain, now = _gain([path], assignment, dtype, costs)
            if gain > margin * now > 0:
                moves.append((gain, [path], dtype, path))
    moves.sort(key=lambda move: (-move[0], move[3]))
    return moves


def _may_move(path: str, dtype: str, feasibility: Feasibility) -> bool:
    """Whether a cost move may give `path` `dtype`: allowed, and not an output the loss floors."""
    return dtype in feasibility.allowed[path] and (
        dtype == FLOAT32 or path not in feasibility.floors
    )


def _gain(
    members: Sequence[str], assignment: Mapping[str, str], dtype: str, costs: PlanCosts
) -> tuple[float, float]:
    """Returns `(seconds saved, seconds now)` of the members' own time moved to `dtype`."""
    now = after = 0.0
    for path in members:
        current = costs.layer_seconds(path, assignment[path])
        moved = costs.layer_seconds(path, dtype)
        if current is None or moved is None:
            return 0.0, 0.0
        now += current
        after += moved
    return now - after, now


logger = logging.getLogger("autoprec")


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
    """Returns the fastest uniform policy, left per layer only where evidence says so, without Optuna.

    The plan starts from the fastest uniform policy among float32 and the 16-bit
    dtypes allowed (predicted whole steps with a cost table; without one, bfloat16
    where the hardware runs it fast, else float16), set on every layer as Keras'
    global `mixed_*` policy sets it: normalisation, softmax and the output layers
    included, since Keras computes normalisation and the loss in float32 inside such
    a policy already. A layer leaves that start only with evidence, recorded in
    `plan.metadata["evidence"][path]` (`kind`, `from`, `dtype`, `reason` with its
    figures):

    - `"range"`: the profile shows its values overflow or flush to zero in float16, it
      receives values above float16's max from such a layer, or it computes or
      normalises attention logits that overflow (the key projection and the softmax
      of that attention); it takes the next dtype on the ladder: bfloat16 where
      allowed, else float32. Nothing else moves with it: its neighbours and its
      block keep the start's dtype, with casts at the boundary;
    - `"cost"`: the cost table predicts (or measured) the layer, or its block, faster
      in another dtype by more than the prediction's error (`CostTable.relative_error`),
      and the whole step faster with the casts the move adds;
    - `"float8"`: on FP8 hardware, a Dense/EinsumDense layer whose float8 ranges fit
      (flush-to-zero and saturation after per-tensor scaling, amax growth) is
      predicted faster in float8 the same way;
    - `"budget"`: an output layer a regression loss reads (its 16-bit rounding floors
      the loss), a layer whose 16-bit dtype fails `check`, or a layer the profile
      could not record (`Profile.unrecorded`);
    - `"user"`: a `keep_float32` glob.

    The plan is then predicted no slower than every uniform policy the profile allows
    (float32 included): where one is predicted faster, it is returned instead.
    `plan.metadata["start"]` records the policies weighed and their predicted steps,
    `metadata["loss_scale"]["initial"]` where a float16 plan's loss scale starts (the profile's).
    With `check`, the 16-bit layers are tried greedily and a failing set is bisected
    (as onnxconverter-common's auto mixed precision does) until only the layers whose
    16-bit dtype breaks `check` stay float32. The decision is logged (`"autoprec"`
    logger, INFO).

    Args:
        model: a built Keras model.
        profile: an `autoprec.profiler.Profile` (float16 and float8 feasibility), or `None`.
        costs: an `autoprec.cost.CostTable`, or `None` (no cost moves; the start is
            the hardware's fast 16-bit dtype).
        hardware: `"local"` (this device, detected), a profile name such as
            `"rtx4090"` or a `HardwareProfile`; its slow 16-bit dtypes are not used
            unless listed in `dtypes`.
        dtypes: dtypes allowed (default: float32 plus the hardware's fast 16-bit
            dtypes).
        keep_float32: globs on layer paths or class names kept in float32.
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
    feasibility = layer_feasibility(model, infos, profile, dtypes, keep_float32)
    refused = [(path, why[FLOAT8]) for path, why in feasibility.removed.items() if FLOAT8 in why]
    for path, reason in refused[:8]:  # the Dense/EinsumDense layers refused float8, and why
        logger.info("autoprec.heuristic: %s gets no float8: %s", path, reason)
    batch_size = (costs.batch_size if costs is not None else None) or 32
    cost_view = PlanCosts(model, costs, batch_size)
    source = cost_source(costs, hardware_profile)
    start = choose_start(feasibility, dtypes, hardware_profile, cost_view)
    departures = {departure.path: departure for departure in start.departures}
    assignment = dict(start.assignment)
    if cost_view.available:
        assignment = cost_departures(
            assignment, departures, feasibility, cost_view, start.dtype, source
        )
        assignment = _never_slower(assignment, departures, start, feasibility, cost_view)
    if check is not None:
        assignment = _bisect_16_bit(assignment, departures, model, infos, check, start.dtype)
    _log_decision(start, assignment, departures, cost_view, source)
    metadata = {
        "evidence": {path: departures[path].to_dict() for path in sorted(departures)},
        "start": start.to_dict(source),
    }
    if not departures and len(set(assignment.values())) <= 1:
        # No layer leaves the start: the plan is Keras' own policy, set on every layer.
        dtype = next(iter(assignment.values()), FLOAT32)
        plan = PrecisionPlan.uniform(model, dtype, metadata=metadata)
    else:
        plan = plan_from_assignment(model, infos, assignment, metadata=metadata)
    return with_loss_scale_start(plan, profile)


def layer_feasibility(
    model: keras.Model,
    infos: Mapping[str, LayerInfo],
    profile: Profile | None,
    dtypes: Sequence[str],
    keep_float32: Sequence[str],
) -> Feasibility:
    """What each compute layer may take, from the profile, the hardware's dtypes and the loss."""
    compute = compute_layers(infos)
    outputs, unsafe = output_layers(model, infos), float16_unsafe_layers(profile, model)
    allowed, removed = allowed_dtypes(
        compute,
        infos,
        dtypes,
        unsafe,
        list(keep_float32),
        float8_unsafe=float8_unsafe_layers(profile),
        outputs=outputs,
    )
    unrecorded = profile.unrecorded if profile is not None else ()
    why = "profile: its recording raised, so its values are unknown"
    floors = {path: why for path in unrecorded if path in compute}
    floors = {**rounding_floor_outputs(model, outputs), **floors}
    return Feasibility(tuple(compute), allowed, removed, floors, unsafe, frozenset(outputs))


def _never_slower(
    assignment: dict[str, str],
    departures: dict[str, Departure],
    start: Start,
    feasibility: Feasibility,
    costs: PlanCosts,
) -> dict[str, str]:
    """Returns the fastest uniform policy instead of `assignment` where one is predicted faster."""
    seconds = costs.step(assignment)[0]
    uniform_seconds = {}
    for dtype, uniform in start.uniform.items():
        keras_policy = not ladder_assignment(dtype, feasibility)[1]
        uniform_seconds[dtype] = (
            costs.uniform_seconds(dtype) if keras_policy else costs.step(uniform)[0]
        )
    dtype = min(uniform_seconds, key=lambda name: (uniform_seconds[name], name != FLOAT32))
    if uniform_seconds[dtype] >= seconds or (not departures and dtype == start.dtype):
        return assignment
    logger.info(
        "autoprec.heuristic: the per-layer plan (%.3f ms) is predicted slower than uniform %s "
        "(%.3f ms): using uniform %s",
        seconds * 1e3,
        dtype,
        uniform_seconds[dtype] * 1e3,
        dtype,
    )
    uniform, kept = ladder_assignment(dtype, feasibility)
    departures.clear()
    departures.update({departure.path: departure for departure in kept})
    return uniform


def _log_decision(
    start: Start,
    assignment: Mapping[str, str],
    departures: Mapping[str, Departure],
    costs: PlanCosts,
    source: str,
) -> None:
    """Logs the policies weighed, the start kept and the departures from it (INFO)."""
    weighed = ", ".join(
        f"uniform {dtype} {seconds * 1e3:.3f} ms" for dtype, seconds in start.step_seconds.items()
    )
    kinds: dict[str, int] = {}
    for departure in departures.values():
        kinds[departure.kind] = kinds.get(departure.kind, 0) + 1
    plan_ms = f"; plan {costs.step(assignment)[0] * 1e3:.3f} ms" if costs.available else ""
    logger.info(
        "autoprec.heuristic: %s (%s); start: uniform %s; %d layer(s) leave it%s: %s%s",
        weighed or "no cost table",
        source,
        start.dtype,
        len(departures),
        "" if not kinds else " (" + ", ".join(f"{n} {kind}" for kind, n in kinds.items()) + ")",
        counts_text(count_dtypes(assignment.values())),
        plan_ms,
    )


def _bisect_16_bit(
    assignment: dict[str, str],
    departures: dict[str, Departure],
    model: keras.Model,
    infos: Mapping[str, LayerInfo],
    check: Callable[[PrecisionPlan], bool],
    start: str,
) -> dict[str, str]:
    """Returns `assignment` with each layer whose 16-bit dtype fails `check` back in float32."""
    reduced = [(path, dtype) for path, dtype in assignment.items() if dtype != FLOAT32]
    base = {path: FLOAT32 for path in assignment}
    accepted: list[tuple[str, str]] = []

    def passes(extra: list[tuple[str, str]]) -> bool:
        trial = dict(base)
        trial.update(dict(accepted + extra))
        return bool(check(plan_from_assignment(model, infos, trial)))

    def visit(subset: list[tuple[str, str]]) -> None:
        if not subset:
            return
        if passes(subset):
            accepted.extend(subset)
            return
        if len(subset) == 1:
            path, dtype = subset[0]
            logger.info("autoprec.heuristic: %s stays float32 (the check fails in %s)", path, dtype)
            departures[path] = Departure(
                path, start, FLOAT32, "budget", f"budget: the check fails with it in {dtype}"
            )
            return
        middle = len(subset) // 2
        visit(subset[:middle])
        visit(subset[middle:])

    visit(reduced)
    result = dict(base)
    result.update(dict(accepted))
    return result
