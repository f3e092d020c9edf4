"""The decision behind `AutoPrecision()` with no plan: profile + local costs -> heuristic plan."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import keras

from . import cost
from ._core.dtypes import BFLOAT16, FLOAT16, FLOAT32, count_dtypes, counts_text
from .cost import Estimate
from .hardware import HardwareProfile, is_local, resolve_hardware
from .plan import PrecisionPlan
from .profiler import Profile
from .search import (
    compute_layers,
    float16_unsafe_layers,
    heuristic_plan,
    is_sensitive,
    output_layers,
)

logger = logging.getLogger("autoprec")


def decide_plan(
    model: keras.Model,
    profile: Profile | None,
    hardware: HardwareProfile | str | None = "local",
    batch_size: int = 32,
    calibrate_costs: bool = True,
) -> tuple[PrecisionPlan, Estimate | None]:
    """Returns the heuristic plan for `model` and the estimate behind it.

    Costs are measured on the local device (`hardware="local"`, cached) or
    predicted from a named hardware profile. Layers whose recorded ranges do not
    fit float16 never get float16.

    Args:
        model: the built model being trained.
        profile: an `autoprec.profiler.Profile`, or `None` when none could be recorded.
        hardware: `"local"` (this device) or a hardware profile (name or
            `HardwareProfile`), as `autoprec.hardware.resolve_hardware` accepts.
        batch_size: batch size the costs are measured or predicted for.
        calibrate_costs: measure costs on this device when `hardware` means this device.

    Returns:
        `(plan, estimate)`; `estimate` is `None` if no cost model could be built.

    Example:

    ```python
    plan, estimate = decide_plan(model, prof, hardware="rtx4090", batch_size=64)
    ```
    """
    hardware_profile = resolve_hardware(hardware)
    allowed = [FLOAT32] + [
        dtype for dtype in (BFLOAT16, FLOAT16) if hardware_profile.is_fast(dtype)
    ]
    costs = None
    try:
        if calibrate_costs and is_local(hardware):
            sample = cost.sample_inputs(model, batch_size)
            costs = cost.calibrate(
                model, sample, dtypes=allowed, verbose=0, hardware=hardware_profile
            )
        else:
            costs = cost.predict_costs(model, hardware_profile, batch_size=batch_size)
    except Exception as error:  # costs improve the plan; their absence must not stop training
        logger.warning("autoprec: cost model unavailable (%s); deciding from parameters", error)
    plan = heuristic_plan(
        model, profile=profile, costs=costs, hardware=hardware_profile, dtypes=allowed
    )
    estimate = None
    if costs is not None:
        try:
            estimate = cost.estimate(model, plan, costs=costs, batch_size=batch_size)
        except Exception as error:
            logger.warning("autoprec: no estimate for the plan (%s)", error)
    plan = plan.with_metadata(
        hardware=hardware_profile.name,
        predicted_speedup=estimate.speedup if estimate is not None else None,
        evidence=float32_reasons(model, plan, profile, allowed),
    )
    return plan, estimate


def float32_reasons(
    model: keras.Model, plan: PrecisionPlan, profile: Profile | None, allowed: Sequence[str]
) -> dict[str, dict[str, str]]:
    """Returns `{path: {"reason": ...}}` for each computing layer the plan keeps in float32.

    Args:
        model: the model the plan is for.
        plan: the plan, with `layer_info` (as `heuristic_plan` returns it).
        profile: the recorded profile, or `None`.
        allowed: the dtypes the plan could use on this device.

    Returns:
        One entry per float32 compute layer, saying why it stayed float32.

    Example:

    ```python
    float32_reasons(model, plan, prof, ["float32", "bfloat16"])["head"]["reason"]
    ```
    """
    infos = plan.layer_info
    outputs = output_layers(model, infos)
    unsafe = float16_unsafe_layers(profile) if profile is not None else {}
    reasons: dict[str, dict[str, str]] = {}
    for path in compute_layers(infos):
        if plan.layers.get(path) != FLOAT32:
            continue
        if path in outputs:
            reason = "model output: kept float32 for the loss"
        elif is_sensitive(infos[path]):
            reason = f"{infos[path].class_name} is numerically sensitive (exp/normalisation)"
        elif path in unsafe and BFLOAT16 not in allowed:
            reason = f"float16 unsafe ({unsafe[path]}); bfloat16 not fast on this device"
        elif len(allowed) == 1:
            reason = "no 16-bit dtype runs fast on this device"
        else:
            reason = "16-bit measured no faster than float32 here"
        reasons[path] = {"reason": reason}
    return reasons


def report_lines(
    plan: PrecisionPlan, estimate: Estimate | None, dtypes: Mapping[str, str]
) -> list[str]:
    """Returns the compact report printed once when the automatic plan is applied.

    Args:
        plan: the plan as applied, with `metadata["hardware"]` and `["evidence"]`.
        estimate: the cost estimate behind it, or `None`.
        dtypes: `{path: dtype}` each layer computes in.

    Returns:
        One line of counts and predicted speedup, then a line per float32 layer (at most 8).

    Example:

    ```python
    print("\n".join(report_lines(plan, estimate, handle.dtypes)))
    ```
    """
    speedup = estimate.speedup if estimate is not None else None
    lines = [
        "autoprec: automatic plan: "
        + counts_text(count_dtypes(dtypes.values()))
        + " layer(s)"
        + (f"; predicted speedup {speedup:.2f}x over float32" if speedup else "")
        + f" on {plan.metadata.get('hardware')}"
    ]
    evidence = plan.metadata.get("evidence") or {}
    for path, entry in list(evidence.items())[:8]:
        lines.append(f"  float32 {path}: {entry.get('reason')}")
    if len(evidence) > 8:
        lines.append(f"  ... and {len(evidence) - 8} more float32 layer(s); see plan.summary()")
    return lines
