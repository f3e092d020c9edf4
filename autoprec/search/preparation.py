"""The search's first stages: its space, its float32 reference, and running the trials."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import optuna

from .._core.dtypes import COMPUTE_DTYPES, FLOAT8, FLOAT16, FLOAT32
from ..cost import CostTable, calibrate, predict_costs
from ..hardware import HardwareProfile, is_local, resolve_hardware
from ..layers import describe_model
from ..plan import PrecisionPlan
from .budget import Budget
from .confirmation import say
from .context import SearchContext
from .evaluator import Evaluator, check_reference
from .record import REFERENCE_METRIC_ATTR, TrainedOutcome, assignment_key
from .settings import SearchRequest
from .space import (
    PlanCosts,
    allowed_dtypes,
    compute_layers,
    default_dtypes,
    float8_unsafe_layers,
    float16_unsafe_layers,
    group_layers,
    is_sensitive,
    make_groups,
    output_layers,
    run_profiler,
)
from .storage import resolve_storage
from .study import open_study, plan_writer, trial_objective
from .warm_start import enqueue_warm_starts, explorer, warm_starts

logger = logging.getLogger("autoprec")


def _space(model: keras.Model, evaluator: Evaluator, request: SearchRequest) -> dict[str, Any]:
    """Returns the context's space fields: costs (measured or predicted), dtypes, profile, groups."""
    settings = request.settings
    infos = describe_model(model)
    compute = compute_layers(infos)
    hardware_profile: HardwareProfile | None = None
    table = settings.costs
    cost_batch_size = settings.cost_batch_size or evaluator.batch_size
    if table is None:
        with request.clock.stage("costs"):
            hardware_profile, table = load_costs(
                evaluator.model,
                request.hardware,
                evaluator.train_batches[0],
                settings.dtypes,
                request.verbose,
                cost_batch_size,
            )
    elif not is_local(request.hardware):
        hardware_profile = resolve_hardware(request.hardware)
    dtypes = tuple(default_dtypes(settings.dtypes, hardware_profile, table))
    float16_trials = _float16_trials(evaluator, settings.float16_trials, dtypes, request.verbose)
    profile = settings.profile
    if profile is None and (FLOAT16 in dtypes or FLOAT8 in dtypes):
        with request.clock.stage("profile"):
            profile = run_profiler(
                evaluator.model,
                (evaluator.train_x, evaluator.train_y),
                settings.profile_steps,
                evaluator.batch_size,
                float8_ranges=FLOAT8 in dtypes,
            )
    unsafe = float16_unsafe_layers(profile)
    outputs = output_layers(model, infos)
    allowed, removed = allowed_dtypes(
        compute,
        infos,
        dtypes,
        unsafe,
        settings.keep_float32,
        float8_unsafe=float8_unsafe_layers(profile),
        outputs=outputs,
    )
    grouped = group_layers(compute, settings.group_by, separate=outputs)
    return dict(
        infos=infos,
        compute=compute,
        hardware_profile=hardware_profile,
        table=table,
        costs=PlanCosts(evaluator.model, table, cost_batch_size),
        dtypes=dtypes,
        float16_trials=float16_trials,
        profile=profile,
        unsafe=unsafe,
        allowed=allowed,
        removed=removed,
        outputs=outputs,
        groups=make_groups(grouped, allowed),
    )


def _float16_trials(
    evaluator: Evaluator, requested: str, dtypes: Sequence[str], verbose: int
) -> str | None:
    """Turns float16 emulation on where asked or needed; returns "native", "emulated" or None."""
    if FLOAT16 not in dtypes:
        return None
    emulate = requested == "emulated" or (
        requested == "auto" and not resolve_hardware("local").is_fast(FLOAT16)
    )
    if emulate and evaluator.emulate_float16():
        say(
            verbose,
            "autoprec.search: float16 has no fast kernels here; trials emulate it (float32 "
            "math, float16 rounding at layer boundaries).",
        )
        return "emulated"
    return "native"


def load_costs(
    model: keras.Model,
    hardware: HardwareProfile | str | None,
    batch: tuple,
    dtypes: Sequence[str] | None,
    verbose: int,
    batch_size: int,
) -> tuple[HardwareProfile, CostTable]:
    """Returns `(hardware profile, cost table)`: measured here for a local `hardware`, else
    predicted."""
    profile = resolve_hardware(hardware)
    if is_local(hardware):
        # Time only what the search may use: float16 on a CPU costs minutes per model to time.
        measured = default_dtypes(dtypes, profile, None)
        table = calibrate(
            model, batch, dtypes=list(measured), verbose=int(verbose > 1), hardware=profile
        )
    else:
        # The batch gives the shapes of inputs with dynamic dimensions (sequence lengths).
        table = predict_costs(
            model,
            profile,
            batch_size=batch_size,
            x=batch,
            dtypes=list(dtypes or _predicted_dtypes(profile)),
        )
    return profile, table


def _predicted_dtypes(profile: HardwareProfile) -> list[str]:
    """Every compute dtype, and float8 where the device has FP8 tensor cores."""
    return [*COMPUTE_DTYPES, FLOAT8] if profile.is_fast(FLOAT8) else list(COMPUTE_DTYPES)


def prepare(model: keras.Model, evaluator: Evaluator, request: SearchRequest) -> SearchContext:
    """Returns the search's context: its space, then the float32 reference, lengthened until it
    beats a trivial baseline; its cache holds the reference."""
    space = _space(model, evaluator, request)
    settings, budget = request.settings, request.budget
    with request.clock.stage("reference"):
        metrics, fidelity = check_reference(
            evaluator,
            budget,
            request.train_data,
            settings.batch_size,
            request.max_train_steps,
            settings.baseline,
        )
        spread = _reference_spread(
            evaluator, budget, fidelity.reference, settings.reference_repeats
        )
    float32_seconds, _ = space["costs"].step({path: FLOAT32 for path in space["compute"]})
    context = SearchContext(
        model=model,
        evaluator=evaluator,
        budget=budget,
        reference=fidelity.reference,
        float32_seconds=float32_seconds,
        verbose=request.verbose,
        request=request,
        reference_metrics=dict(metrics),
        fidelity=fidelity,
        spread=spread,
        **space,
    )
    context.risk = _risk(context)
    context.cache[assignment_key(context.uniform_assignment(FLOAT32))] = TrainedOutcome(
        metrics=dict(metrics),
        proxy={"loss_relative_error": 0.0, "gradient_cosine": 1.0, "finite": True},
        proxy_score=0.0,
        trial="reference",
    )
    _announce(context)
    return context


def _reference_spread(
    evaluator: Evaluator, budget: Budget, reference: float, repeats: int
) -> float | None:
    if repeats <= 0:
        return None
    values = [reference]
    float32_plan = PrecisionPlan.uniform(evaluator.model, FLOAT32)
    original_seed = evaluator.seed
    try:
        for repeat in range(repeats):
            order = list(
                np.random.default_rng(original_seed + repeat + 1).permutation(
                    len(evaluator.train_batches)
                )
            )
            evaluator.seed = original_seed + repeat + 1
            metrics = evaluator.train_and_evaluate(float32_plan, batch_order=order)
            values.append(metrics[budget.log_name])
    finally:
        evaluator.seed = original_seed
    spread = float(np.std(values, ddof=1))
    if budget.allowance(reference) < spread:
        message = (
            f"Budget on {budget.metric} allows {budget.allowance(reference):.3g}, less than "
            f"the float32 reference's own seed-to-seed spread {spread:.3g} "
            f"({repeats + 1} runs): plans are judged within noise."
        )
        warnings.warn(message, stacklevel=5)
        logger.warning("autoprec.search: %s", message)
    return spread


def _risk(context: SearchContext) -> dict[str, float]:
    """Returns `{path: risk}` of 16-bit per layer: output layers 2, softmax/normalisation 1, and 1
    more where the profile found ranges float16 cannot hold."""
    risk = {}
    for path in context.compute:
        value = 0.0
        if path in context.outputs:
            value += 2.0
        if is_sensitive(context.infos[path]):
            value += 1.0
        if path in context.unsafe:
            value += 1.0
        risk[path] = value
    return risk


def _announce(context: SearchContext) -> None:
    """Shows the search's one line about its space and reference."""
    budget, fidelity, request = context.budget, context.fidelity, context.request
    named = request.settings.costs is None and context.hardware_profile is not None
    cost_words = (
        f"predicted for {context.hardware_profile.name}"
        if named and not is_local(request.hardware)
        else f"{getattr(context.table, 'source', 'no')} costs"
    )
    say(
        request.verbose,
        "autoprec.search: %d compute layers in %d groups; dtypes %s; float32 reference "
        "%s = %.6g after %d train steps (budget %s %.6g; trivial baseline %s %s); "
        "float32 step %.3f ms (%s)",
        len(context.compute),
        len(context.groups),
        "/".join(context.dtypes),
        budget.metric,
        context.reference,
        fidelity.train_steps,
        ">=" if budget.mode == "max" else "<=",
        budget.threshold(context.reference),
        "n/a" if fidelity.baseline is None else f"{fidelity.baseline:.4g}",
        fidelity.baseline_kind,
        context.float32_seconds * 1e3,
        cost_words,
    )


def search_metadata(context: SearchContext) -> dict[str, Any]:
    """Returns the plan metadata every plan of the search carries (hardware, budget, settings)."""
    spread, request, evaluator = context.spread, context.request, context.evaluator
    return {
        "hardware": getattr(context.hardware_profile, "name", None) or str(request.hardware),
        "budget": {**context.budget.to_dict(), "reference_spread": spread},
        "search": {
            "study_name": context.study.study_name,
            "seed": request.settings.seed,
            "train_steps": len(evaluator.train_batches),
            "batch_size": evaluator.batch_size,
            "dtypes": list(context.dtypes),
            "groups": len(context.groups),
            "cost_source": getattr(context.table, "source", None),
            "float16_trials": context.float16_trials,
            "reference_spread": spread,
            "fidelity_check": context.fidelity.to_dict(),
        },
    }


def run_trials(context: SearchContext) -> optuna.Study:
    """Opens the study, enqueues the warm starts once, and runs this call's trials."""
    request = context.request
    settings = request.settings
    starts = warm_starts(
        context,
        context.model,
        context.profile,
        context.table,
        context.hardware_profile or request.hardware,
        context.dtypes,
        settings.keep_float32,
    )
    study, created = _study(request)
    context.study = study
    added = enqueue_warm_starts(study, starts)
    study.set_user_attr(REFERENCE_METRIC_ATTR, context.reference)
    say(
        request.verbose,
        "autoprec.search: study %r (%s, %d trial(s) already); %d warm start(s) enqueued",
        study.study_name,
        "new" if created else "resumed",
        len(study.trials) - added,
        added,
    )
    context.metadata = metadata = search_metadata(context)
    n_trials = request.n_trials
    if all(len(group.choices) <= 1 for group in context.groups):
        say(
            request.verbose,
            "autoprec.search: nothing to choose (one dtype per layer); one trial only.",
        )
        n_trials = min(n_trials or 1, 1)
    writer = plan_writer(context, settings.plan_path, metadata)
    with request.clock.stage("trials"):
        study.optimize(
            lambda trial: trial_objective(context, trial),
            n_trials=n_trials,
            timeout=request.timeout,
            catch=tuple(settings.catch),
            callbacks=[writer, explorer(context), *settings.callbacks],
            show_progress_bar=request.verbose >= 1,
        )
    return study


def _study(request: SearchRequest) -> tuple[optuna.Study, bool]:
    """Returns `(study, created)`: the study given, or the one `storage`/`study_name` name."""
    if request.study is not None:
        return request.study, not request.study.trials
    return open_study(
        resolve_storage(request.storage),
        request.study_name,
        request.settings.seed,
        request.settings.proxy_tolerance,
        sampler=request.sampler,
        pruner=request.pruner,
    )
