"""The heuristic's plan as a uniform start and the layers that leave it, each with its evidence."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32, widen
from ..cost import CostTable
from ..hardware import HardwareProfile
from .plan_costs import PlanCosts
from .space import group_layers

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


def range_blocks(
    assignment: Mapping[str, str],
    departures: Mapping[str, Departure],
    feasibility: Feasibility,
    costs: PlanCosts,
) -> dict[str, str]:
    """Widens the block around each range departure where that is predicted to save its casts."""
    result = dict(assignment)
    blocks = group_layers(list(feasibility.compute), "block")
    block_of = {path: tuple(block) for block in blocks for path in block}
    current = costs.step(result)[0]
    for path, departure in list(departures.items()):
        if departure.kind != "range":
            continue
        members = [
            member
            for member in block_of.get(path, ())
            if result[member] != departure.dtype
            and departure.dtype in feasibility.allowed[member]
            and member not in departures
        ]
        if not members:
            continue
        trial = dict(result)
        trial.update(dict.fromkeys(members, departure.dtype))
        seconds = costs.step(trial)[0]
        if seconds >= current:
            continue
        why = (
            f"range: in the block of {path}, whose {departure.start} range breaks: "
            f"{departure.dtype} for the block saves its casts (whole step "
            f"{current * 1e3:.3f} -> {seconds * 1e3:.3f} ms)"
        )
        for member in members:
            departures[member] = Departure(member, departure.start, departure.dtype, "range", why)
        result, current = trial, seconds
    return result


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
