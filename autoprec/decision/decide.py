"""The automatic mode's decision: the heuristic plan from the profile and the costs, or the search."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import keras

from .. import cost
from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32
from ..cost import CostTable, Estimate
from ..hardware import HardwareProfile, is_local, resolve_hardware
from ..plan import PrecisionPlan
from ..profiler import Profile
from ..search import (
    SearchResult,
    SearchSettings,
    heuristic_plan,
    search,
)
from .auto_plan import AutoPlan

logger = logging.getLogger("autoprec")

#: The shortest decision budget costs are timed here within (whole steps first take seconds):
#: below it, costs are predicted for the device and the race inside `fit` measures.
MIN_CALIBRATION_SECONDS = 15.0

#: The batch size costs are timed at when `fit` ran no step to read it from.
FALLBACK_BATCH_SIZE = 32


def decide_plan(
    model: keras.Model,
    profile: Profile | None,
    hardware: HardwareProfile | str | None = "local",
    batch_size: int = FALLBACK_BATCH_SIZE,
    calibrate_costs: bool = True,
    verbose: int = 0,
    sample: Any = None,
    time_budget: float | None = None,
    trace_seconds: float = 0.0,
) -> tuple[PrecisionPlan, Estimate | None]:
    """Returns the heuristic plan for `model` and the estimate behind it."""
    hardware_profile = resolve_hardware(hardware)
    allowed = [FLOAT32] + [
        dtype for dtype in (BFLOAT16, FLOAT16, FLOAT8) if hardware_profile.is_fast(dtype)
    ]
    costs = None
    traces = (len(allowed) + 2) * trace_seconds  # calibrate's whole uniform and mixed steps
    too_short = time_budget is not None and time_budget < MIN_CALIBRATION_SECONDS + traces
    if calibrate_costs and is_local(hardware) and too_short:
        logger.info(
            "autoprec: a %.1f s decision budget is too short to time costs here (%.1f s of "
            "it would trace whole steps); costs are predicted for %s and the whole steps "
            "timed inside fit decide",
            time_budget,
            traces,
            hardware_profile.name,
        )
    try:
        if calibrate_costs and is_local(hardware) and not too_short:
            if sample is None:
                sample = cost.sample_inputs(model, batch_size)
            costs = measure_costs(model, sample, allowed, hardware_profile, verbose, time_budget)
        else:
            costs = cost.predict_costs(model, hardware_profile, batch_size=batch_size, x=sample)
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
    )
    return plan, estimate


#: Layers of one class the one-liner times; the others of the class are predicted from them.
LAYERS_PER_KIND = 2


def measure_costs(
    model: keras.Model,
    sample: Any,
    dtypes: Sequence[str],
    hardware: HardwareProfile,
    verbose: int,
    time_budget: float | None = None,
) -> CostTable:
    """Returns the layer costs measured on this device for `sample`'s batch size (`cost.calibrate`)."""
    return cost.calibrate(
        model,
        sample,
        dtypes=dtypes,
        verbose=int(verbose >= 1),
        hardware=hardware,
        time_budget=time_budget,
        layers_per_kind=LAYERS_PER_KIND,
    )


def search_plan(
    model: keras.Model,
    auto: AutoPlan,
    profile: Profile | None,
    hardware: HardwareProfile | str,
    batch_size: int,
) -> SearchResult:
    """Returns the result of the short search `AutoPlan(budget=...)` asks for."""
    return search(
        model,
        auto.x,
        auto.validation_data,
        budget=auto.budget,
        hardware=hardware,
        n_trials=auto.n_trials,
        verbose=0,
        settings=SearchSettings(profile=profile, batch_size=batch_size),
    )
