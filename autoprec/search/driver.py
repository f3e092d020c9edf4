"""`search()` and `search_in_processes()`: the stages in order, in one process or several."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np
import optuna

from .._core.data import take_batches
from .._core.dtypes import COMPUTE_DTYPES, FLOAT8, FLOAT16, FLOAT32
from ..cost import CostTable, calibrate, predict_costs
from ..errors import AutoprecError, BackendError
from ..hardware import HardwareProfile, is_local, resolve_hardware
from ..layers import describe_model
from ..plan import PrecisionPlan
from ..runtime.guard import GUARD_BACKENDS
from .budget import Budget
from .context import SearchContext, SearchSettings, say
from .evaluator import Evaluator, check_reference
from .heuristic import layer_feasibility
from .result import SearchResult, TrialRecord, assignment_key
from .selection import add_finalists, choose_plan, rank_trials
from .space import (
    PlanCosts,
    compute_layers,
    default_dtypes,
    group_layers,
    is_sensitive,
    make_groups,
    run_profiler,
)
from .study import enqueue_warm_starts, explorer, open_study, optimize, warm_starts

logger = logging.getLogger("autoprec")


def search(
    model: keras.Model,
    x: Any,
    validation_data: Any,
    *,
    budget: Budget,
    hardware: HardwareProfile | str = "local",
    n_trials: int | None = 20,
    timeout: float | None = None,
    storage: str | os.PathLike | optuna.storages.BaseStorage | None = None,
    study_name: str | None = None,
    study: optuna.Study | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
    settings: SearchSettings | None = None,
    verbose: int = 1,
) -> SearchResult:
    """Searches the cheapest dtype per layer whose short-training metric stays within `budget`.

    Trials run on a clone of the model (a subclassed model without `get_config` is used
    itself and put back at the end). The plan returned costs no more than any uniform plan,
    the heuristic's or Keras' global policies that held the budget and, where steps are timed
    here, is the fastest of them beyond the measured noise (docs/api.md tells the stages).

    Args:
        model: a built, compiled Keras model.
        x: the training data, in any form `model.fit` takes in one argument.
        validation_data: the same kinds; the budget metric is evaluated on it.
        budget: an `autoprec.Budget`.
        hardware: `"local"` (costs measured here), a profile name or a `HardwareProfile`.
        n_trials: trials to run in this call; `None` runs until `timeout`.
        timeout: stop starting trials after this many seconds.
        storage: any Optuna storage: a database URL, a journal file or a storage object.
        study_name: the study's name (needed to resume or share a study).
        study: an `optuna.Study` (minimised) to search in instead of `storage`.
        sampler: an Optuna sampler; default a seeded `optuna.samplers.TPESampler`.
        pruner: an Optuna pruner; default one that prunes on the numerical proxy.
        settings: an `autoprec.SearchSettings`; default `SearchSettings()`.
        verbose: 0 silent, 1 a progress bar and one line per stage, 2 one per trial.

    Returns:
        A `SearchResult`.

    Raises:
        BackendError: on a Keras backend other than TensorFlow or JAX.
        AutoprecError: the budget metric is not reported, the model is not compiled,
            or the float32 reference has not learned at the search's fidelity.

    Example:

    ```python
    result = autoprec.search(model, (x, y), (x_val, y_val),
                             budget=autoprec.Budget("val_accuracy", max_drop=0.01),
                             n_trials=20, storage="sqlite:///autoprec.db", study_name="mlp")
    print(result.report())
    result.plan.save("plan.json")
    ```
    """
    started = time.perf_counter()
    backend = keras.backend.backend()
    if backend not in GUARD_BACKENDS:
        raise BackendError(
            f"autoprec.search runs on Keras' TensorFlow and JAX backends (its trials train "
            f"with the guard and time costs there); this Keras runs {backend!r}. Set "
            "KERAS_BACKEND=tensorflow or jax before importing keras, or predict a plan "
            "without training with autoprec.heuristic_plan(model, hardware=...)."
        )
    settings = SearchSettings() if settings is None else settings
    for name, value, kind in (("budget", budget, Budget), ("settings", settings, SearchSettings)):
        if not isinstance(value, kind):
            raise AutoprecError(
                f"search: {name} must be an autoprec.{kind.__name__}, got {type(value).__name__}."
            )
    _check_study(study, storage, study_name, sampler, pruner)
    train_batches = take_batches(
        x, settings.batch_size, settings.steps_per_trial,
        what="search: x", error_class=AutoprecError,
    )  # fmt: skip
    val_batches = take_batches(
        validation_data, settings.batch_size, settings.validation_steps,
        what="search: validation_data", error_class=AutoprecError,
    )  # fmt: skip
    seed = 0 if settings.seed is None else int(settings.seed)
    evaluator = Evaluator(model, train_batches, val_batches, settings.proxy_batches, seed)
    context = SearchContext(
        model=model, evaluator=evaluator, budget=budget, hardware=hardware, n_trials=n_trials,
        timeout=timeout, storage=storage, study_name=study_name, study=study, sampler=sampler,
        pruner=pruner, settings=settings, verbose=verbose, started=started, train_data=x,
    )  # fmt: skip
    try:
        check_metric(evaluator, budget)
        prepare(context)  # the stages in order, on one context
        run_trials(context)
        with context.clock.stage("finalists"):
            add_finalists(context)
        rank_trials(context)
        return choose_plan(context)
    finally:
        evaluator.close()


def _check_study(
    study: optuna.Study | None,
    storage: object,
    study_name: str | None,
    sampler: optuna.samplers.BaseSampler | None,
    pruner: optuna.pruners.BasePruner | None,
) -> None:
    """Refuses a `study=` given with what it already has, or one that does not minimise."""
    if study is None:
        return
    if storage is not None or study_name is not None:
        raise AutoprecError(
            "search: pass either study= or storage=/study_name=, not both (a study already "
            "has its storage and name)."
        )
    if sampler is not None or pruner is not None:
        raise AutoprecError(
            "search: study= brings its own sampler and pruner; pass them to "
            "optuna.create_study instead of to search."
        )
    if len(study.directions) != 1 or study.direction != optuna.study.StudyDirection.MINIMIZE:
        raise AutoprecError(
            f"search: study {study.study_name!r} must have one objective, minimised (it holds "
            "the predicted step time); create it with optuna.create_study(direction='minimize')."
        )


def check_metric(evaluator: Evaluator, budget: Budget) -> None:
    """Refuses a budget metric the model does not report, listing those it does."""
    names = evaluator.metric_names()
    if budget.log_name not in names:
        available = ", ".join(f"val_{name}" for name in names)
        raise AutoprecError(
            f"Budget metric {budget.metric!r} is not reported by the model; it reports "
            f"{available} on validation data. Add the metric in model.compile(metrics=[...]) "
            "or pick one of these."
        )


def _worker(arguments: Mapping[str, Any], index: int) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    keywords = dict(arguments)
    settings = keywords.get("settings") or SearchSettings()
    keywords["settings"] = dataclasses.replace(settings, seed=int(settings.seed or 0) + index)
    search(**keywords)


def search_in_processes(
    workers: int,
    model: keras.Model,
    x: Any,
    validation_data: Any,
    *,
    budget: Budget,
    storage: str | os.PathLike,
    study_name: str,
    n_trials: int = 20,
    **search_arguments: Any,
) -> SearchResult:
    """Searches one study with `workers` local processes of `n_trials` trials each (worker `i`
    seeded `settings.seed + i`); returns the whole study's `SearchResult` once they finish."""
    if workers < 1:
        raise AutoprecError(f"search_in_processes: workers must be at least 1, got {workers}.")
    arguments = {
        **search_arguments,
        "model": model,
        "x": x,
        "validation_data": validation_data,
        "budget": budget,
        "storage": os.fspath(storage),
        "study_name": study_name,
        "n_trials": n_trials,
    }
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_worker, args=(arguments, index), name=f"autoprec-search-{index}")
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    failed = [(p.name, p.exitcode) for p in processes if p.exitcode != 0]
    if failed:
        raise AutoprecError(
            "search_in_processes: worker(s) "
            + ", ".join(f"{name} (exit code {code})" for name, code in failed)
            + f" failed; the study {study_name!r} in {os.fspath(storage)} keeps their "
            "finished trials, rerun to resume."
        )
    return search(**{**arguments, "n_trials": 0})


def _space(context: SearchContext) -> None:
    """Sets the context's space: costs (measured or predicted), dtypes, profile, groups."""
    settings, evaluator, model = context.settings, context.evaluator, context.model
    context.infos = infos = describe_model(model)
    context.compute = compute = compute_layers(infos)
    context.table = settings.costs
    cost_batch_size = settings.cost_batch_size or evaluator.batch_size
    if context.table is None:
        with context.clock.stage("costs"):
            context.hardware_profile, context.table = load_costs(context, cost_batch_size)
    elif not is_local(context.hardware):
        context.hardware_profile = resolve_hardware(context.hardware)
    context.costs = PlanCosts(evaluator.model, context.table, cost_batch_size)
    context.dtypes = dtypes = default_dtypes(
        settings.dtypes, context.hardware_profile, context.table
    )
    context.float16_trials = _float16_trials(context)
    profile = settings.profile
    if profile is None and (FLOAT16 in dtypes or FLOAT8 in dtypes):
        with context.clock.stage("profile"):
            profile = run_profiler(
                evaluator.model,
                (evaluator.train_x, evaluator.train_y),
                settings.profile_steps,
                evaluator.batch_size,
                float8_ranges=FLOAT8 in dtypes,
            )
    context.profile = profile
    feasible = layer_feasibility(model, infos, profile, dtypes, settings.keep_float32)
    context.unsafe, context.outputs = feasible.unsafe, set(feasible.outputs)
    context.allowed, context.removed = dict(feasible.allowed), feasible.removed
    grouped = group_layers(compute, settings.group_by, separate=context.outputs)
    context.groups = make_groups(grouped, context.allowed)


def _float16_trials(context: SearchContext) -> str | None:
    """Turns float16 emulation on where asked or needed; returns "native", "emulated" or None."""
    if FLOAT16 not in context.dtypes:
        return None
    requested = context.settings.float16_trials
    emulate = requested == "emulated" or (
        requested == "auto" and not resolve_hardware("local").is_fast(FLOAT16)
    )
    if emulate and context.evaluator.emulate_float16():
        say(
            context.verbose,
            "float16 has no fast kernels here; trials emulate it (float32 math, float16 "
            "rounding at layer boundaries).",
        )
        return "emulated"
    return "native"


def load_costs(context: SearchContext, batch_size: int) -> tuple[HardwareProfile, CostTable]:
    """Returns `(hardware profile, cost table)`: measured here for a local `hardware`, else predicted."""
    profile, dtypes = resolve_hardware(context.hardware), context.settings.dtypes
    model, batch = context.evaluator.model, context.evaluator.train_batches[0]
    if is_local(context.hardware):
        # Time only what the search may use: float16 on a CPU costs minutes per model to time.
        measured = list(default_dtypes(dtypes, profile, None))
        verbose = int(context.verbose > 1)
        return profile, calibrate(model, batch, dtypes=measured, verbose=verbose, hardware=profile)
    if not dtypes:  # every compute dtype, and float8 where the device has FP8 tensor cores
        dtypes = [*COMPUTE_DTYPES, FLOAT8] if profile.is_fast(FLOAT8) else COMPUTE_DTYPES
    # The batch gives the shapes of inputs with dynamic dimensions (sequence lengths).
    return profile, predict_costs(
        model, profile, batch_size=batch_size, x=batch, dtypes=list(dtypes)
    )


def prepare(context: SearchContext) -> SearchContext:
    """Builds the context's space and the float32 reference (in its cache); returns the context."""
    _space(context)
    settings, budget, evaluator = context.settings, context.budget, context.evaluator
    with context.clock.stage("reference"):
        metrics, context.fidelity = check_reference(
            evaluator,
            budget,
            context.train_data,
            settings.batch_size,
            settings.max_steps_per_trial or 8 * len(evaluator.train_batches),
            settings.baseline,
        )
        context.reference = context.fidelity.reference
        context.spread = _reference_spread(context)
    context.float32_seconds, _ = context.costs.step(dict.fromkeys(context.compute, FLOAT32))
    context.risk = {  # the risk of 16 bits: output 2, softmax/normalisation 1, unsafe float16 1
        path: 2.0 * (path in context.outputs)
        + float(is_sensitive(context.infos[path]))
        + float(path in context.unsafe)
        for path in context.compute
    }
    context.cache[assignment_key(context.uniform_assignment(FLOAT32))] = TrialRecord(
        metrics=dict(metrics),
        proxy={"loss_relative_error": 0.0, "gradient_cosine": 1.0, "finite": True},
        proxy_score=0.0,
        reused_from="reference",
    )
    _announce(context)
    return context


def _reference_spread(context: SearchContext) -> float | None:
    evaluator, budget, reference = context.evaluator, context.budget, context.reference
    repeats = context.settings.reference_repeats
    if repeats <= 0:
        return None
    values = [reference]
    float32_plan = PrecisionPlan.uniform(evaluator.model, FLOAT32)
    original_seed = evaluator.seed
    try:
        for seed in range(original_seed + 1, original_seed + repeats + 1):
            order = list(np.random.default_rng(seed).permutation(len(evaluator.train_batches)))
            evaluator.seed = seed
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


def _announce(context: SearchContext) -> None:
    """Shows the search's one line about its space and reference."""
    budget, fidelity = context.budget, context.fidelity
    named = context.settings.costs is None and context.hardware_profile is not None
    cost_words = (
        f"predicted for {context.hardware_profile.name}"
        if named and not is_local(context.hardware)
        else f"{getattr(context.table, 'source', 'no')} costs"
    )
    baseline = "n/a" if fidelity.baseline is None else f"{fidelity.baseline:.4g}"
    say(
        context.verbose,
        f"{len(context.compute)} compute layers in {len(context.groups)} groups; "
        f"dtypes {'/'.join(context.dtypes)}; float32 reference {budget.metric} = "
        f"{context.reference:.6g} after {fidelity.train_steps} train steps (budget "
        f"{'>=' if budget.mode == 'max' else '<='} {budget.threshold(context.reference):.6g}; "
        f"trivial baseline {baseline} {fidelity.baseline_kind}); float32 step "
        f"{context.float32_seconds * 1e3:.3f} ms ({cost_words})",
    )


def search_metadata(context: SearchContext) -> dict[str, Any]:
    """Returns the plan metadata every plan of the search carries (hardware, budget, settings)."""
    spread, evaluator = context.spread, context.evaluator
    return {
        "hardware": getattr(context.hardware_profile, "name", None) or str(context.hardware),
        "budget": {**context.budget.to_dict(), "reference_spread": spread},
        "search": {
            "study_name": context.study.study_name,
            "seed": context.settings.seed,
            "train_steps": len(evaluator.train_batches),
            "batch_size": evaluator.batch_size,
            "dtypes": list(context.dtypes),
            "groups": len(context.groups),
            "cost_source": getattr(context.table, "source", None),
            "float16_trials": context.float16_trials,
            "reference_spread": spread,
            "fidelity_check": dataclasses.asdict(context.fidelity),
        },
    }


def run_trials(context: SearchContext) -> optuna.Study:
    """Opens the study, enqueues the warm starts once, and runs this call's trials."""
    starts = warm_starts(context)
    study, created = open_study(context)
    context.study = study
    added = enqueue_warm_starts(study, starts)
    study.set_user_attr("reference_metric", context.reference)
    state = f"{'new' if created else 'resumed'}, {len(study.trials) - added} trial(s) already"
    say(context.verbose, f"study {study.study_name!r} ({state}); {added} warm start(s) enqueued")
    context.metadata = search_metadata(context)
    n_trials = context.n_trials
    if all(len(group.choices) <= 1 for group in context.groups):
        say(context.verbose, "nothing to choose (one dtype per layer); one trial only.")
        n_trials = min(n_trials or 1, 1)
    with context.clock.stage("trials"):
        optimize(context, n_trials, timeout=context.timeout, explorer=explorer(context))
    return study
