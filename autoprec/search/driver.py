"""`search()` and what it does around the study: costs, reference, warm starts, confirmation."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import optuna

from .._core.data import take_batches
from .._core.dtypes import BFLOAT16, COMPUTE_DTYPES, FLOAT16, FLOAT32
from ..cost import CostTable, calibrate, predict_costs
from ..errors import AutoprecError
from ..hardware import HardwareProfile, is_local, resolve_hardware
from ..layers import LayerInfo, describe_model
from ..plan import PrecisionPlan
from ..profiler import Profile
from .budget import Budget
from .confirmation import (
    confirm_plan,
    measured_seconds_of,
    order_by_measurement,
    say,
)
from .evaluator import Evaluator
from .explore import explorer
from .fidelity import check_reference
from .heuristic import PlanCosts, heuristic_plan
from .result import SearchResult
from .settings import SearchSettings
from .space import (
    allowed_dtypes,
    compute_layers,
    default_dtypes,
    float16_unsafe_layers,
    group_layers,
    is_sensitive,
    make_groups,
    output_layers,
    run_profiler,
)
from .study import (
    SearchContext,
    assignment_key,
    enqueue_warm_starts,
    is_feasible,
    open_study,
    pareto_points,
    plan_writer,
    resolve_storage,
    trial_objective,
    trial_plan_metadata,
)

logger = logging.getLogger("autoprec")


@dataclasses.dataclass(frozen=True)
class _Request:
    """What one `search()` call asked for beyond the model and data: its arguments, resolved."""

    budget: Budget
    hardware: HardwareProfile | str
    n_trials: int | None
    timeout: float | None
    storage: str | os.PathLike | optuna.storages.BaseStorage | None
    study_name: str | None
    study: optuna.Study | None
    sampler: optuna.samplers.BaseSampler | None
    pruner: optuna.pruners.BasePruner | None
    settings: SearchSettings
    verbose: int
    started: float
    train_data: Any
    max_train_steps: int
    #: Seconds spent in each stage, filled in as the search goes (see `_stage`).
    stage_seconds: dict[str, float] = dataclasses.field(default_factory=dict)


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

    The user's model is left unchanged: trials run on a clone
    (`keras.models.clone_model`, same weights, recompiled with a fresh copy of the
    optimizer from its config and the same loss and metrics). Subclassed models
    need `get_config` to be cloned; without it the search works on the model itself
    and puts back its weights and policies at the end (its optimizer is never used).
    Every uniform plan and the heuristic's per-layer plan are evaluated first, and the
    returned plan costs no more than any of them that held the budget.

    Args:
        model: a built, compiled Keras model.
        x: the training data, as `model.fit` takes it in one argument: an `(x, y)` or
            `(x, y, sample_weight)` tuple of arrays, a `tf.data.Dataset`, a
            `keras.utils.PyDataset` or a generator of such batches. Every trial trains
            on its first `settings.steps_per_trial` batches, in order.
        validation_data: the same kinds; the budget metric is evaluated on it.
        budget: an `autoprec.Budget`.
        hardware: `"local"` (this device: layer costs measured here with
            `autoprec.calibrate`), a hardware profile name such as `"rtx4090"` or a
            `HardwareProfile` (costs predicted for that device).
        n_trials: trials to run in this call (added to those already in the study);
            `None` runs until `timeout`.
        timeout: stop starting trials after this many seconds.
        storage: any Optuna storage: a URL (`"sqlite:///autoprec.db"`,
            `"postgresql://..."`), a journal file (`"journal:///path/file.log"` or a path
            ending `.log`), or a storage object. The same storage and `study_name`
            resume the study; several processes, on one machine or many, may share one.
        study_name: the study's name (needed to resume or share a study).
        study: an `optuna.Study` to search in instead of `storage` and `study_name`
            (created with `direction="minimize"`); its sampler and pruner are used.
        sampler: an Optuna sampler; default a seeded `optuna.samplers.TPESampler`.
        pruner: an Optuna pruner; default one that prunes plans whose numerical proxy
            misses `settings.proxy_tolerance` before they are trained.
        settings: an `autoprec.SearchSettings` with the rarer knobs (batch size, steps
            per trial, dtypes, grouping, a profile or cost table to reuse, plan path,
            Optuna callbacks); default `SearchSettings()`.
        verbose: 0 silent, 1 (default) a progress bar over trials and one log line per
            stage (logger `"autoprec"`), 2 also one line per trial and the calibration
            progress.

    Returns:
        A `SearchResult`.

    Raises:
        AutoprecError: the budget metric is not reported by the model (the message
            lists those that are), the model is not compiled, or the float32
            reference has not learned at the search's fidelity (the message names the
            metric, its value, the baseline and what to change).

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
    if not isinstance(budget, Budget):
        raise AutoprecError(
            f"search: budget must be an autoprec.Budget, got {type(budget).__name__}."
        )
    settings = SearchSettings() if settings is None else settings
    if not isinstance(settings, SearchSettings):
        raise AutoprecError(
            f"search: settings must be an autoprec.SearchSettings, got {type(settings).__name__}."
        )
    if study is not None and (storage is not None or study_name is not None):
        raise AutoprecError(
            "search: pass either study= or storage=/study_name=, not both (a study already "
            "has its storage and name)."
        )
    if study is not None and (sampler is not None or pruner is not None):
        raise AutoprecError(
            "search: study= brings its own sampler and pruner; pass them to "
            "optuna.create_study instead of to search."
        )
    if study is not None and (
        len(study.directions) != 1 or study.direction != optuna.study.StudyDirection.MINIMIZE
    ):
        raise AutoprecError(
            f"search: study {study.study_name!r} must have one objective, minimised (it holds "
            "the predicted step time); create it with optuna.create_study(direction='minimize')."
        )
    seed_value = 0 if settings.seed is None else int(settings.seed)
    train_batches = take_batches(
        x,
        settings.batch_size,
        settings.steps_per_trial,
        what="search: x",
        error_class=AutoprecError,
    )
    val_batches = take_batches(
        validation_data,
        settings.batch_size,
        settings.validation_steps,
        what="search: validation_data",
        error_class=AutoprecError,
    )
    request = _Request(
        budget=budget,
        hardware=hardware,
        n_trials=n_trials,
        timeout=timeout,
        storage=storage,
        study_name=study_name,
        study=study,
        sampler=sampler,
        pruner=pruner,
        settings=settings,
        verbose=verbose,
        started=started,
        train_data=x,
        max_train_steps=settings.max_steps_per_trial or 8 * len(train_batches),
    )
    evaluator = Evaluator(model, train_batches, val_batches, settings.proxy_batches, seed_value)
    try:
        _check_metric(evaluator, budget)
        return _run_search(model, evaluator, request)
    finally:
        evaluator.close()


@contextlib.contextmanager
def _stage(request: _Request, name: str) -> Iterator[None]:
    """Adds the seconds spent inside the block to `request.stage_seconds[name]`."""
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds = time.perf_counter() - started
        request.stage_seconds[name] = request.stage_seconds.get(name, 0.0) + seconds


def _check_metric(evaluator: Evaluator, budget: Budget) -> None:
    names = evaluator.metric_names()
    if budget.log_name not in names:
        available = ", ".join(f"val_{name}" for name in names)
        raise AutoprecError(
            f"Budget metric {budget.metric!r} is not reported by the model; it reports "
            f"{available} on validation data. Add the metric in model.compile(metrics=[...]) "
            "or pick one of these."
        )


def _run_search(model: keras.Model, evaluator: Evaluator, request: _Request) -> SearchResult:
    settings = request.settings
    budget = request.budget
    verbose = request.verbose
    infos = describe_model(model)
    compute = compute_layers(infos)

    hardware_profile: HardwareProfile | None = None
    table = settings.costs
    if table is None:
        with _stage(request, "costs"):
            hardware_profile, table = _load_costs(
                evaluator.model,
                request.hardware,
                evaluator.train_batches[0],
                settings.dtypes,
                verbose,
                settings.cost_batch_size or evaluator.batch_size,
            )
    elif not is_local(request.hardware):
        hardware_profile = resolve_hardware(request.hardware)
    dtypes = default_dtypes(settings.dtypes, hardware_profile, table)
    costs = PlanCosts(evaluator.model, table, settings.cost_batch_size or evaluator.batch_size)

    float16_trials = _float16_trials(evaluator, settings.float16_trials, dtypes, verbose)
    profile = settings.profile
    if profile is None and FLOAT16 in dtypes:
        with _stage(request, "profile"):
            profile = run_profiler(
                evaluator.model,
                (evaluator.train_x, evaluator.train_y),
                settings.profile_steps,
                evaluator.batch_size,
            )
    unsafe = float16_unsafe_layers(profile)
    allowed, removed = allowed_dtypes(compute, infos, dtypes, unsafe, settings.keep_float32)
    outputs = output_layers(model, infos)
    grouped = group_layers(compute, settings.group_by, separate=outputs)
    groups = make_groups(grouped, allowed)

    with _stage(request, "reference"):
        reference_metrics, fidelity = check_reference(
            evaluator,
            budget,
            request.train_data,
            settings.batch_size,
            request.max_train_steps,
            settings.baseline,
        )
        reference = fidelity.reference
        spread = _reference_spread(evaluator, budget, reference, settings.reference_repeats)
    float32_seconds, _ = costs.step({path: FLOAT32 for path in compute})
    context = SearchContext(
        model=model,
        infos=infos,
        compute=compute,
        groups=groups,
        allowed=allowed,
        evaluator=evaluator,
        costs=costs,
        budget=budget,
        reference=reference,
        float32_seconds=float32_seconds,
        verbose=verbose,
        risk=_risk(compute, infos, outputs, unsafe),
    )
    context.cache[assignment_key({p: FLOAT32 for p in compute})] = {
        "metrics": reference_metrics,
        "proxy": {"loss_relative_error": 0.0, "gradient_cosine": 1.0, "finite": True},
        "proxy_score": 0.0,
        "trial": "reference",
    }
    cost_words = (
        f"predicted for {hardware_profile.name}"
        if settings.costs is None
        and hardware_profile is not None
        and not is_local(request.hardware)
        else f"{getattr(table, 'source', 'no')} costs"
    )
    say(
        verbose,
        "autoprec.search: %d compute layers in %d groups; dtypes %s; float32 reference "
        "%s = %.6g after %d train steps (budget %s %.6g; trivial baseline %s %s); "
        "float32 step %.3f ms (%s)",
        len(compute),
        len(groups),
        "/".join(dtypes),
        budget.metric,
        reference,
        fidelity.train_steps,
        ">=" if budget.mode == "max" else "<=",
        budget.threshold(reference),
        "n/a" if fidelity.baseline is None else f"{fidelity.baseline:.4g}",
        fidelity.baseline_kind,
        float32_seconds * 1e3,
        cost_words,
    )

    warm = _warm_starts(
        context,
        model,
        profile,
        table,
        hardware_profile or request.hardware,
        dtypes,
        settings.keep_float32,
    )
    if request.study is not None:
        study, created = request.study, not request.study.trials
    else:
        study, created = open_study(
            resolve_storage(request.storage),
            request.study_name,
            settings.seed,
            settings.proxy_tolerance,
            sampler=request.sampler,
            pruner=request.pruner,
        )
    added = enqueue_warm_starts(study, warm, created)
    study.set_user_attr("reference_metric", reference)
    say(
        verbose,
        "autoprec.search: study %r (%s, %d trial(s) already); %d warm start(s) enqueued",
        study.study_name,
        "new" if created else "resumed",
        len(study.trials) - added,
        added,
    )

    base_metadata = {
        "hardware": getattr(hardware_profile, "name", None) or str(request.hardware),
        "budget": {**budget.to_dict(), "reference_spread": spread},
        "search": {
            "study_name": study.study_name,
            "seed": settings.seed,
            "train_steps": len(evaluator.train_batches),
            "batch_size": evaluator.batch_size,
            "dtypes": list(dtypes),
            "groups": len(groups),
            "cost_source": getattr(table, "source", None),
            "float16_trials": float16_trials,
            "reference_spread": spread,
            "fidelity_check": fidelity.to_dict(),
        },
    }
    n_trials = request.n_trials
    if all(len(group.choices) <= 1 for group in groups):
        say(verbose, "autoprec.search: nothing to choose (one dtype per layer); one trial only.")
        n_trials = min(n_trials or 1, 1)
    writer = plan_writer(context, settings.plan_path, base_metadata)
    with _stage(request, "trials"):
        study.optimize(
            lambda trial: trial_objective(context, trial),
            n_trials=n_trials,
            timeout=request.timeout,
            catch=tuple(settings.catch),
            callbacks=[writer, explorer(context), *settings.callbacks],
            show_progress_bar=verbose >= 1,
        )
    return _finish(context, study, base_metadata, spread, table, removed, unsafe, request)


def _float16_trials(
    evaluator: Evaluator, requested: str, dtypes: Sequence[str], verbose: int
) -> str | None:
    """Turns float16 emulation on where asked or needed; returns "native", "emulated" or None.

    `"auto"` emulates where this device has no fast float16 kernels; `None` when float16
    is not among the search's dtypes.
    """
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


def _risk(
    compute: Sequence[str],
    infos: Mapping[str, LayerInfo],
    outputs: set[str],
    unsafe: Mapping[str, str],
) -> dict[str, float]:
    """Returns `{path: risk}` of 16-bit per layer: output layers 2, softmax/normalisation 1,
    and 1 more where the profile found ranges float16 cannot hold."""
    risk = {}
    for path in compute:
        value = 0.0
        if path in outputs:
            value += 2.0
        if is_sensitive(infos[path]):
            value += 1.0
        if path in unsafe:
            value += 1.0
        risk[path] = value
    return risk


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
        warnings.warn(message, stacklevel=3)
        logger.warning("autoprec.search: %s", message)
    return spread


def _warm_starts(
    context: SearchContext,
    model: keras.Model,
    profile: Profile | None,
    table: CostTable | None,
    hardware: HardwareProfile | str,
    dtypes: Sequence[str],
    keep_float32: Sequence[str],
) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    """Returns `(label, per-layer assignment, group params)` of the plans every study starts with.

    float32, each uniform 16-bit dtype the search may use (with the float32 protections:
    `keep_float32` and the profile's float16-unsafe layers) and the heuristic's own
    per-layer plan, each evaluated ungrouped; equal assignments appear once.
    """
    warm = [("float32", context.uniform_assignment(FLOAT32))]
    for dtype in (BFLOAT16, FLOAT16):
        if dtype in dtypes:
            warm.append((f"uniform {dtype}", context.uniform_assignment(dtype)))
    heuristic = heuristic_plan(
        model,
        profile=profile,
        costs=table,
        hardware=hardware,
        dtypes=dtypes,
        keep_float32=keep_float32,
    )
    warm.append(("heuristic", context.normalise(dict(heuristic.layers))))
    unique: list[tuple[str, dict[str, str], dict[str, str]]] = []
    for label, assignment in warm:
        if all(assignment != other for _, other, _ in unique):
            unique.append((label, assignment, context.params_for(assignment)))
    return unique


def _finish(
    context: SearchContext,
    study: optuna.Study,
    base_metadata: dict,
    spread: float | None,
    table: CostTable | None,
    removed: Mapping[str, Mapping[str, str]],
    unsafe: Mapping[str, str],
    request: _Request,
) -> SearchResult:
    settings = request.settings
    ranked = _ranked_feasible(context, study)
    points = pareto_points(context, study)
    if not ranked:
        logger.warning(
            "autoprec.search: no plan met the budget in %d trial(s); returning float32.",
            len(study.trials),
        )
    local = settings.costs is None and is_local(request.hardware)
    measure = settings.measure_speedup if settings.measure_speedup is not None else local
    timed: dict[str, float] = {}
    rounds: dict[str, list[float]] = {}
    names: dict[int, str] = {}
    replaced = None
    if measure and ranked:
        with _stage(request, "measurement"):
            ranked, timed, rounds, names, replaced = order_by_measurement(context, ranked)
    with _stage(request, "confirmation"):
        chosen, confirmation = confirm_plan(
            context, ranked, spread, request.train_data, settings.batch_size, settings.confirm_steps
        )
    if chosen is None:
        params_plan = context.plan_for(context.uniform_assignment(FLOAT32))
        trial_metadata = {
            **base_metadata,
            "reference_metric": context.reference,
            "measured_metric": context.reference,
            "predicted_speedup": 1.0,
        }
    else:
        params_plan = context.trial_plan(chosen)
        trial_metadata = trial_plan_metadata(context, chosen, base_metadata)
    plan = params_plan
    if replaced is not None and chosen is not None and chosen.number == replaced[1]:
        trial_metadata["search"] = {
            **trial_metadata.get("search", {}),
            "replaced_by_measurement": replaced[0],
        }
    measured_speedup = None
    if measure:
        with _stage(request, "measurement"):
            chosen_seconds = measured_seconds_of(context, chosen, plan, timed, names)
        measured_speedup = timed["float32"] / chosen_seconds
        trial_metadata["search"] = {
            **trial_metadata.get("search", {}),
            "measured_float32_step_seconds": timed["float32"],
            "measured_plan_step_seconds": chosen_seconds,
            "measured_step_seconds": dict(timed),
            "measured_step_rounds": rounds,
        }
    trial_metadata["measured_speedup"] = measured_speedup
    trial_metadata["evidence"] = _evidence(context, table, removed, unsafe)
    trial_metadata["search"] = {
        **trial_metadata.get("search", {}),
        "trials": len(study.trials),
        "complete": sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials),
        "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials),
        "failed": sum(t.state == optuna.trial.TrialState.FAIL for t in study.trials),
        "reused": sum(bool(t.user_attrs.get("reused")) for t in study.trials),
        "wall_seconds": time.perf_counter() - request.started,
        "stage_seconds": {name: round(value, 3) for name, value in request.stage_seconds.items()},
        "fidelity": "train",
        "warm_starts": _warm_start_summary(study),
        "confirmation": confirmation,
    }
    plan = plan.with_metadata(**trial_metadata)
    if settings.plan_path is not None:
        plan.save(settings.plan_path)
    return SearchResult(
        plan=plan,
        study=study,
        budget=context.budget,
        reference_metric=context.reference,
        reference_spread=spread,
        points=points,
        float32_predicted_seconds=context.float32_seconds,
    )


def _ranked_feasible(context: SearchContext, study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Returns the completed trials within budget, cheapest first, one per assignment."""
    feasible = [
        trial
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if is_feasible(trial) and trial.value is not None
    ]
    ranked, seen = [], set()
    for trial in sorted(feasible, key=lambda t: (t.value, t.number)):
        key = assignment_key(context.trial_assignment(trial))
        if key not in seen:
            seen.add(key)
            ranked.append(trial)
    return ranked


def _warm_start_summary(study: optuna.Study) -> dict[str, dict]:
    """Returns `{label: {trial, metric, within_budget, predicted_seconds}}` of the warm starts."""
    summary = {}
    for trial in study.get_trials(deepcopy=False):
        label = trial.user_attrs.get("warm_start")
        if not label or label in summary:
            continue
        summary[label] = {
            "trial": trial.number,
            "state": trial.state.name,
            "metric": trial.user_attrs.get("metric"),
            "within_budget": is_feasible(trial),
            "predicted_seconds": trial.user_attrs.get("predicted_seconds"),
        }
    return summary


def _evidence(
    context: SearchContext,
    table: CostTable | None,
    removed: Mapping[str, Mapping[str, str]],
    unsafe: Mapping[str, str],
) -> dict[str, dict]:
    """Returns `{path: {"allowed", "removed", "seconds", "profile"}}`: why each layer could be what."""
    evidence: dict[str, dict] = {}
    for path in context.compute:
        entry: dict[str, object] = {"allowed": list(context.allowed[path])}
        if path in removed:
            entry["removed"] = dict(removed[path])
        seconds = {dtype: context.costs.layer_seconds(path, dtype) for dtype in COMPUTE_DTYPES}
        seconds = {dtype: value for dtype, value in seconds.items() if value is not None}
        if seconds:
            entry["seconds"] = seconds
        if path in unsafe:
            entry["profile"] = unsafe[path]
        evidence[path] = entry
    return evidence


def _load_costs(
    model: keras.Model,
    hardware: HardwareProfile | str | None,
    batch: tuple,
    dtypes: Sequence[str] | None,
    verbose: int,
    batch_size: int,
) -> tuple[HardwareProfile, CostTable]:
    """Returns `(hardware profile, cost table)`: measured here for a local `hardware`, else predicted.

    `dtypes` is what the user asked for (`None`: what the hardware runs fast).
    """
    profile = resolve_hardware(hardware)
    if is_local(hardware):
        # Time only what the search may use: float16 on a CPU costs minutes per model to time.
        measured = default_dtypes(dtypes, profile, None)
        table = calibrate(
            model, batch, dtypes=list(measured), verbose=int(verbose > 1), hardware=profile
        )
    else:
        table = predict_costs(
            model, profile, batch_size=batch_size, dtypes=list(dtypes or COMPUTE_DTYPES)
        )
    return profile, table
