"""The whole train steps timed inside `fit`: the plans raced, the report of the race, the plan kept."""

from __future__ import annotations

from collections.abc import Mapping

import keras

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32
from ..cost import Estimate
from ..hardware import HardwareProfile
from ..layers import layer_paths, layer_policy
from ..plan import PrecisionPlan
from ..profiler import Profile
from ..runtime.step_race import RaceResult
from ..search import (
    float8_unsafe_layers,
    float16_unsafe_layers,
    has_classification_loss,
    output_layers,
)

#: The name of the per-layer plan among the plans timed inside `fit`.
PER_LAYER = "per-layer"


def race_candidates(
    model: keras.Model,
    plan: PrecisionPlan,
    profile: Profile | None,
    hardware: HardwareProfile,
) -> dict[str, PrecisionPlan]:
    """Returns the plans whose whole step the one-liner times, simplest first, each once."""
    candidates = {FLOAT32: PrecisionPlan.uniform(model, FLOAT32)}
    outputs = () if has_classification_loss(model) else output_layers(model, plan.layer_info)
    for dtype in (BFLOAT16, FLOAT16):
        if not hardware.is_fast(dtype):
            continue
        if dtype == FLOAT16 and (profile is None or float16_unsafe_layers(profile)):
            continue
        uniform = PrecisionPlan.uniform(model, dtype)
        for path in sorted(outputs):
            uniform = uniform.with_dtype(path, FLOAT32)
        candidates[f"mixed_{dtype}"] = uniform
    if hardware.is_fast(FLOAT8) and hardware.is_fast(BFLOAT16):
        # Float8 wherever Keras allows it, output layers and float8-unsafe layers excepted.
        uniform = PrecisionPlan.uniform(model, FLOAT8)
        refused = {*output_layers(model, plan.layer_info), *float8_unsafe_layers(profile)}
        for path in sorted(refused & set(uniform.layers)):
            if uniform.layers[path] == FLOAT8:
                uniform = uniform.with_dtype(path, BFLOAT16)
        candidates["float8"] = uniform
    candidates[PER_LAYER] = plan
    unique: dict[str, PrecisionPlan] = {}
    seen: list[dict[str, str]] = []
    for name, candidate in candidates.items():
        dtypes = candidate.resolve()
        if dtypes not in seen:
            seen.append(dtypes)
            unique[name] = candidate
    return unique


def race_traces(
    model: keras.Model, candidates: Mapping[str, PrecisionPlan], reuse_fit_step: bool = True
) -> int:
    """Returns how many train steps timing `candidates` inside `fit` traces, at most."""
    paths = layer_paths(model)
    running = {path: layer_policy(layer).compute_dtype for path, layer in paths.items()}
    traced = [
        name
        for name, candidate in candidates.items()
        if not reuse_fit_step
        or any(running.get(path) != dtype for path, dtype in candidate.resolve().items())
    ]
    return len(traced) + (1 if traced else 0)


def race_lines(result: RaceResult, estimate: Estimate | None) -> list[str]:
    """Returns the report of the whole steps timed inside `fit`: what was timed and what it chose."""
    verdict = result.verdict
    names = list(result.rounds)
    timed = (
        f"autoprec: timed the whole train step of {', '.join(names)} inside fit "
        f"({result.rounds_run} interleaved round(s) of 2 steps; {result.steps} steps, "
        f"+{result.added_seconds:.1f} s over the chosen plan's pace)"
    )
    if verdict is None:
        return [
            timed,
            "  the first epoch ended before every plan was timed: keeping the per-layer plan",
        ]
    medians = verdict.medians
    figures = ", ".join(f"{name} {1e3 * medians[name]:.2f} ms" for name in medians)
    predicted = (
        f"; predicted {estimate.speedup:.2f}x"
        if estimate is not None and estimate.speedup and PER_LAYER in medians
        else ""
    )
    leader = verdict.leader
    chosen = f"keeping {leader}"
    if leader != FLOAT32:
        chosen += f" ({medians[FLOAT32] / medians[leader]:.2f}x float32)"
    if verdict.fastest != leader:
        noise = verdict.comparisons[leader].noise
        chosen += (
            f"; {verdict.fastest} was {medians[leader] / medians[verdict.fastest]:.2f}x "
            f"faster, inside the measured noise ({1e3 * noise:.2f} ms)"
        )
    return [timed, f"  median step: {figures}{predicted}; {chosen}"]


def race_winner_plan(
    candidates: Mapping[str, PrecisionPlan], result: RaceResult, per_layer: PrecisionPlan
) -> PrecisionPlan:
    """Returns the plan the timing chose, its measurement recorded in `metadata["measured"]`."""
    name = result.winner or PER_LAYER
    measured = result.to_dict()
    if name == PER_LAYER:
        return per_layer.with_metadata(measured=measured)
    return candidates[name].with_metadata(
        hardware=per_layer.metadata.get("hardware"),
        predicted_speedup=None,
        evidence={},
        measured=measured,
    )
