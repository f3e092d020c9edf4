"""`search()`: the cheapest dtype per layer under an accuracy budget, with an Optuna study.

Each trial proposes a plan (one dtype per layer or per group of layers) and runs it at
rising fidelity, cheapest first:

1. profile feasibility: float16 is never proposed for a layer whose ranges do not fit it,
   and dtypes that do not run fast on the target hardware are left out;
2. numerical proxy: loss and gradients on a few calibration batches, from the same
   weights, against float32; hopeless plans are pruned (`trial.report` + `TrialPruned`);
3. short training: S steps from the same checkpoint on the same batches, then the budget
   metric on validation data. Only plans that pass this level can be returned.

The objective is the step time of the plan from the cost model (measured on this device
for `hardware="local"`, predicted from a hardware profile otherwise), with activation
memory as a tie-break; the budget is an Optuna constraint (`trial.set_constraint`, read
by the seeded `TPESampler`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import optuna

from . import _search_space as space_module
from ._core.dtypes import BFLOAT16, COMPUTE_DTYPES, FLOAT16, FLOAT32, canonical_dtype
from ._search_eval import Evaluator, _take_batches
from .errors import AutoprecError
from .layers import LayerInfo, describe_model, model_fingerprint
from .plan import PrecisionPlan

logger = logging.getLogger("autoprec")

_LOWER_IS_BETTER = ("loss", "error", "mse", "mae", "mape", "msle", "crossentropy", "hinge")
_HUGE_VIOLATION = 1e30
_MEMORY_TIE_BREAK = 1e-3
_COST_STEP, _PROXY_STEP = 0, 1


# ============================================================================ Budget


@dataclasses.dataclass(frozen=True)
class Budget:
    """How much worse than float32 a plan's validation metric may be.

    The reference is the float32 model trained and evaluated exactly like each
    candidate: same initial weights, same batches in the same order, same steps.

    Args:
        metric: a metric the compiled model reports on validation data, e.g.
            `"val_accuracy"`, `"val_loss"` or a custom metric's name (with or
            without the `val_` prefix).
        max_drop: largest allowed worsening, in the metric's units.
        max_relative_drop: largest allowed worsening as a fraction of |reference|.
            With both given, both must hold.
        direction: `"higher"` or `"lower"` (is better); inferred from the name
            when omitted (loss, error, mse, mae... are lower-is-better).

    Example:

    ```python
    budget = autoprec.Budget("val_accuracy", max_drop=0.005)
    budget.threshold(0.91)  # 0.905
    ```
    """

    metric: str
    max_drop: float | None = None
    max_relative_drop: float | None = None
    direction: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not self.metric:
            raise AutoprecError(f"Budget: metric must be a metric name, got {self.metric!r}.")
        if self.max_drop is None and self.max_relative_drop is None:
            raise AutoprecError(
                f"Budget({self.metric!r}): give max_drop (absolute, e.g. 0.005) and/or "
                "max_relative_drop (fraction of the reference, e.g. 0.01)."
            )
        for name in ("max_drop", "max_relative_drop"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise AutoprecError(f"Budget: {name} must be a non-negative number, got {value}.")
        direction = self.direction or _infer_direction(self.metric)
        if direction not in ("higher", "lower"):
            raise AutoprecError(
                f"Budget: direction must be 'higher' or 'lower' (is better), got {direction!r}."
            )
        object.__setattr__(self, "direction", direction)

    @property
    def log_name(self) -> str:
        """The key of the metric in `evaluate(return_dict=True)`: the name without `val_`."""
        return self.metric[4:] if self.metric.startswith("val_") else self.metric

    def allowance(self, reference: float) -> float:
        """Returns how much worse than `reference` a plan may be (the tighter of both limits)."""
        limits = []
        if self.max_drop is not None:
            limits.append(self.max_drop)
        if self.max_relative_drop is not None:
            limits.append(self.max_relative_drop * abs(reference))
        return min(limits)

    def threshold(self, reference: float) -> float:
        """Returns the worst metric value still within budget."""
        sign = -1.0 if self.direction == "higher" else 1.0
        return reference + sign * self.allowance(reference)

    def violation(self, reference: float, value: float) -> float:
        """Returns by how much `value` misses the budget: > 0 violated, <= 0 within budget."""
        if value is None or not math.isfinite(value):
            return _HUGE_VIOLATION
        worse_by = reference - value if self.direction == "higher" else value - reference
        return float(worse_by - self.allowance(reference))

    def to_dict(self) -> dict[str, Any]:
        """Returns the budget as a JSON-ready dict."""
        return dataclasses.asdict(self)


def _infer_direction(metric: str) -> str:
    name = metric.lower()
    return "lower" if any(token in name for token in _LOWER_IS_BETTER) else "higher"


# ============================================================================ results


@dataclasses.dataclass(frozen=True)
class ParetoPoint:
    """One evaluated plan: predicted step time against the budget metric.

    Attributes:
        trial: Optuna trial number.
        predicted_seconds: predicted seconds per training step.
        metric: the budget metric after short training.
        feasible: whether the plan met the budget.
        counts: `{dtype: number of compute layers}`.
    """

    trial: int
    predicted_seconds: float
    metric: float
    feasible: bool
    counts: dict[str, int]


@dataclasses.dataclass
class SearchResult:
    """What `search()` found.

    Attributes:
        plan: the best plan within budget (float32 if none was found), with metadata.
        study: the Optuna study (all trials, user attrs per trial).
        budget: the `Budget`.
        reference_metric: the float32 reference's budget metric.
        reference_spread: seed-to-seed standard deviation of the reference, if measured.
        points: every plan trained to level 3, as `ParetoPoint`s.
        float32_predicted_seconds: predicted step time of the float32 plan.
    """

    plan: PrecisionPlan
    study: optuna.Study
    budget: Budget
    reference_metric: float
    reference_spread: float | None
    points: list[ParetoPoint]
    float32_predicted_seconds: float

    @property
    def pareto(self) -> list[ParetoPoint]:
        """The non-dominated points (faster, or better metric), fastest first."""
        better = (lambda a, b: a > b) if self.budget.direction == "higher" else (lambda a, b: a < b)
        front: list[ParetoPoint] = []
        finite = [p for p in self.points if math.isfinite(p.metric)]
        for point in sorted(finite, key=lambda p: (p.predicted_seconds, p.trial)):
            if not front or better(point.metric, front[-1].metric):
                front.append(point)
        return front

    def report(self, plot_path: str | os.PathLike | None = None) -> str:
        """Returns a text table of the Pareto front and the chosen plan; optionally plots it.

        Args:
            plot_path: if given, a matplotlib figure of all points and the front is saved there.

        Returns:
            The report text.
        """
        metadata = self.plan.metadata
        lines = [
            f"autoprec search: {len(self.study.trials)} trial(s), budget "
            f"{self.budget.metric} {'>=' if self.budget.direction == 'higher' else '<='} "
            f"{self.budget.threshold(self.reference_metric):.6g} "
            f"(float32 reference {self.reference_metric:.6g}"
            + (f" ± {self.reference_spread:.3g}" if self.reference_spread is not None else "")
            + ")",
            f"{'trial':>5}  {'pred. step':>11}  {'speedup':>7}  {self.budget.metric:>14}  "
            f"{'ok':>3}  dtypes",
        ]
        for point in self.pareto:
            speedup = self.float32_predicted_seconds / max(point.predicted_seconds, 1e-12)
            lines.append(
                f"{point.trial:>5}  {point.predicted_seconds * 1e3:>9.3f}ms  {speedup:>6.2f}x  "
                f"{point.metric:>14.6g}  {'yes' if point.feasible else 'no':>3}  "
                f"{_counts_text(point.counts)}"
            )
        lines.append(
            f"chosen: {_counts_text(self.plan.dtype_counts())}; metric "
            f"{_fmt(metadata.get('measured_metric'))}, predicted speedup "
            f"{_fmt(metadata.get('predicted_speedup'))}, measured speedup "
            f"{_fmt(metadata.get('measured_speedup'))}"
        )
        if plot_path is not None:
            self._plot(plot_path)
            lines.append(f"plot: {plot_path}")
        return "\n".join(lines)

    def _plot(self, plot_path: str | os.PathLike) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as pyplot
        except ImportError as error:
            raise AutoprecError(
                "report(plot_path=...) needs matplotlib: pip install autoprec[plot]"
            ) from error
        figure, axes = pyplot.subplots(figsize=(6, 4))
        finite = [p for p in self.points if math.isfinite(p.metric)]
        for feasible, colour in ((True, "tab:blue"), (False, "tab:red")):
            chosen = [p for p in finite if p.feasible == feasible]
            axes.scatter(
                [p.predicted_seconds * 1e3 for p in chosen],
                [p.metric for p in chosen],
                c=colour,
                s=16,
                label="within budget" if feasible else "over budget",
            )
        front = self.pareto
        axes.plot(
            [p.predicted_seconds * 1e3 for p in front], [p.metric for p in front], "k--", lw=1
        )
        axes.axhline(self.budget.threshold(self.reference_metric), color="grey", lw=0.8)
        axes.set_xlabel("predicted step time (ms)")
        axes.set_ylabel(self.budget.metric)
        axes.legend()
        figure.tight_layout()
        figure.savefig(plot_path)
        pyplot.close(figure)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "n/a"


def _counts_text(counts: Mapping[str, int]) -> str:
    short = {FLOAT32: "f32", BFLOAT16: "bf16", FLOAT16: "f16"}
    return " / ".join(
        f"{counts.get(dtype, 0)} {short[dtype]}" for dtype in (BFLOAT16, FLOAT32, FLOAT16)
    )


# ============================================================================ costs


class _Costs:
    """Predicted step time and activation memory of plans, from a cost table or (missing) nothing."""

    def __init__(self, model, table: Any, batch_size: int) -> None:
        self.model = model
        self.table = table
        self.batch_size = batch_size
        self._cache: dict[tuple, tuple[float, float]] = {}

    @property
    def available(self) -> bool:
        return self.table is not None

    def layer_seconds(self, path: str, dtype: str) -> float | None:
        if self.table is None or path not in getattr(self.table, "layers", {}):
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
            from . import cost

            estimate = cost.estimate(self.model, dict(dtypes), self.table, self.batch_size)
            result = (float(estimate.step_seconds), float(estimate.activation_bytes_per_sample))
        self._cache[key] = result
        return result

    def _parameter_proxy(self, dtypes: Mapping[str, str]) -> tuple[float, float]:
        infos = describe_model(self.model)
        factor = {FLOAT32: 1.0, BFLOAT16: 0.5, FLOAT16: 0.5}
        total = sum(
            (infos[path].parameters + 1) * factor[dtype]
            for path, dtype in dtypes.items()
            if path in infos
        )
        return total * 1e-9, total


def _load_costs(
    model, hardware: Any, batch: tuple, dtypes: Sequence[str] | None, verbose: int, batch_size: int
) -> tuple[Any, Any]:
    """Returns `(hardware profile, cost table or None)` for `hardware="local"` or a profile name.

    `dtypes` is what the user asked for (`None`: what the hardware runs fast).
    """
    try:
        from . import cost
        from . import hardware as hardware_module
    except ImportError:
        logger.warning(
            "autoprec.search: autoprec.cost is not available; the objective falls back to "
            "parameter counts (a crude proxy for step time)."
        )
        return None, None
    local = hardware is None or (isinstance(hardware, str) and hardware.lower() == "local")
    profile = (
        hardware_module.detect()
        if local
        else (hardware if not isinstance(hardware, str) else hardware_module.get(hardware))
    )
    if local:
        # Time only what the search may use: float16 on a CPU costs minutes per model to time.
        measured = _default_dtypes(dtypes, profile, None)
        table = cost.calibrate(
            model, batch, dtypes=list(measured), progress=bool(verbose > 1), hardware=profile
        )
    else:
        table = cost.predict_costs(
            model, profile, batch_size=batch_size, dtypes=list(dtypes or COMPUTE_DTYPES)
        )
    return profile, table


# ============================================================================ heuristic


def heuristic_plan(
    model,
    profile: Any = None,
    costs: Any = None,
    hardware: Any = None,
    dtypes: Sequence[str] | None = None,
    keep_float32: Sequence[str] | None = None,
    check: Callable[[PrecisionPlan], bool] | None = None,
) -> PrecisionPlan:
    """Returns a plan that puts layers in 16-bit where it pays and is safe, without Optuna.

    Each compute layer gets its cheapest allowed 16-bit dtype (from the cost table, else
    bfloat16 where the hardware runs it fast, else float16) when that is faster than
    float32; float16 is never used where the profile says the layer's ranges do not fit.
    Softmax, normalisation and the model's output layers stay float32. With `check`, the
    demotions are tried greedily by benefit, and a failing set is bisected (as
    onnxconverter-common's auto mixed precision does) until only the layers whose
    demotion breaks `check` stay float32.

    Args:
        model: a built Keras model.
        profile: an `autoprec.profiler.Profile` (float16 feasibility), or `None`.
        costs: an `autoprec.cost.CostTable` (benefit of each demotion), or `None`
            (benefit: parameter count).
        hardware: a `HardwareProfile` or name; its slow dtypes are not used unless
            listed in `dtypes`.
        dtypes: dtypes allowed (default: float32 plus the hardware's fast 16-bit dtypes,
            or bfloat16 when no hardware is given).
        keep_float32: globs on paths or class names kept float32 (replaces the
            default softmax/normalisation list; output layers are always kept).
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
    hardware_profile = _resolve_hardware(hardware)
    dtypes = _default_dtypes(dtypes, hardware_profile, None)
    compute = space_module.compute_layers(infos)
    unsafe = space_module.float16_unsafe_layers(profile)
    allowed, _ = space_module.allowed_dtypes(compute, infos, dtypes, unsafe, keep_float32 or ())
    outputs = space_module.output_layers(model, infos)
    keep = list(keep_float32) if keep_float32 is not None else []
    batch_size = getattr(costs, "batch_size", None) or 32
    cost_view = _Costs(model, costs, batch_size)
    candidates = []
    for path in compute:
        info = infos[path]
        if path in outputs or (keep_float32 is None and space_module.is_sensitive(info)):
            continue
        if keep and space_module.matches_any(path, info, keep):
            continue
        choice, benefit = _best_half(path, info, allowed[path], cost_view, hardware_profile)
        if choice is not None and benefit > 0:
            candidates.append((benefit, path, choice))
    candidates.sort(key=lambda item: (-item[0], item[1]))
    base = {path: FLOAT32 for path in compute}
    demoted = [(path, choice) for _, path, choice in candidates]
    if cost_view.available:
        eligible = [
            path
            for path in compute
            if path not in outputs
            and not (keep_float32 is None and space_module.is_sensitive(infos[path]))
            and not (keep and space_module.matches_any(path, infos[path], keep))
        ]
        demoted = _fastest_whole_plan(demoted, eligible, allowed, base, cost_view)
    if check is not None:
        demoted = _bisect_demotions(demoted, base, model, infos, check)
    assignment = dict(base)
    assignment.update(dict(demoted))
    return _plan_from_assignment(model, infos, assignment)


def _best_half(
    path: str, info: LayerInfo, allowed: Sequence[str], costs: _Costs, hardware_profile
) -> tuple[str | None, float]:
    halves = [dtype for dtype in (BFLOAT16, FLOAT16) if dtype in allowed]
    if not halves:
        return None, 0.0
    if costs.available:
        float32_seconds = costs.layer_seconds(path, FLOAT32)
        timed = [(costs.layer_seconds(path, dtype), dtype) for dtype in halves]
        timed = [(seconds, dtype) for seconds, dtype in timed if seconds is not None]
        if float32_seconds is None or not timed:
            return None, 0.0
        seconds, dtype = min(timed)
        return dtype, float32_seconds - seconds
    if hardware_profile is not None:
        fast = [dtype for dtype in halves if hardware_profile.is_fast(dtype)]
        halves = fast or halves
    return halves[0], float(info.parameters + 1)


def _fastest_whole_plan(
    per_layer: list[tuple[str, str]],
    eligible: Sequence[str],
    allowed: Mapping[str, Sequence[str]],
    base: Mapping[str, str],
    costs: _Costs,
) -> list[tuple[str, str]]:
    """Returns the demotions of the fastest whole plan: per-layer choices, a uniform 16-bit dtype,
    or float32.

    Per-layer timings miss what only the whole step shows (casts between
    neighbours, a dtype's fixed overhead), so the per-layer choice is compared
    with the uniform alternatives on the predicted whole step.
    """
    options: dict[str, list[tuple[str, str]]] = {"per-layer": per_layer, "float32": []}
    for dtype in (BFLOAT16, FLOAT16):
        uniform = [(path, dtype) for path in eligible if dtype in allowed.get(path, ())]
        if uniform:
            options[f"uniform {dtype}"] = uniform

    def seconds(demotions: list[tuple[str, str]]) -> float:
        assignment = dict(base)
        assignment.update(dict(demotions))
        return costs.step(assignment)[0]

    timed = {name: seconds(demotions) for name, demotions in options.items()}
    best = min(timed, key=lambda name: (timed[name], name != "per-layer"))
    logger.info(
        "autoprec.heuristic: predicted step %s; using %s",
        ", ".join(f"{name} {value * 1e3:.2f} ms" for name, value in timed.items()),
        best,
    )
    return options[best]


def _bisect_demotions(
    demoted: list[tuple[str, str]],
    base: dict[str, str],
    model,
    infos: Mapping[str, LayerInfo],
    check: Callable[[PrecisionPlan], bool],
) -> list[tuple[str, str]]:
    accepted: list[tuple[str, str]] = []

    def passes(extra: list[tuple[str, str]]) -> bool:
        assignment = dict(base)
        assignment.update(dict(accepted + extra))
        return bool(check(_plan_from_assignment(model, infos, assignment)))

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


def _plan_from_assignment(
    model, infos: Mapping[str, LayerInfo], assignment: Mapping[str, str], **kwargs: Any
) -> PrecisionPlan:
    return PrecisionPlan(
        dict(assignment),
        default=FLOAT32,
        layer_info=infos,
        fingerprint=model_fingerprint(dict(infos)),
        model_name=model.name,
        **kwargs,
    )


def _resolve_hardware(hardware: Any) -> Any:
    if hardware is None or not isinstance(hardware, str):
        return hardware
    from . import hardware as hardware_module

    return hardware_module.get(hardware)


def _default_dtypes(
    dtypes: Sequence[str] | None, hardware_profile: Any, table: Any
) -> tuple[str, ...]:
    """Returns the dtypes the search may use (level 1, hardware part); logs what it drops."""
    if dtypes is not None:
        chosen = {canonical_dtype(dtype) for dtype in dtypes} | {FLOAT32}
        if hardware_profile is not None:
            for dtype in sorted(chosen - {FLOAT32}):
                if not hardware_profile.is_fast(dtype):
                    logger.info(
                        "autoprec.search: %s is not fast on %s but was asked for in dtypes=; "
                        "kept (the cost model will weigh it).",
                        dtype,
                        getattr(hardware_profile, "name", hardware_profile),
                    )
        return tuple(dtype for dtype in COMPUTE_DTYPES if dtype in chosen)
    if hardware_profile is None:
        return (FLOAT32, BFLOAT16)
    chosen = [FLOAT32]
    for dtype in (BFLOAT16, FLOAT16):
        if not hardware_profile.is_fast(dtype):
            logger.info(
                "autoprec.search: %s left out: not fast on %s (pass dtypes=[...] to force it).",
                dtype,
                getattr(hardware_profile, "name", "this device"),
            )
            continue
        if table is not None and not _pays_off(table, dtype):
            logger.info(
                "autoprec.search: %s left out: measured slower than float32 on this device "
                "for every layer of this model (pass dtypes=[...] to force it).",
                dtype,
            )
            continue
        chosen.append(dtype)
    return tuple(chosen)


def _pays_off(table: Any, dtype: str) -> bool:
    """Whether `dtype` is measurably faster than float32 for at least one layer of the table."""
    for path in table.layers:
        try:
            half, full = table.seconds(path, dtype), table.seconds(path, FLOAT32)
        except Exception:  # noqa: BLE001 - a dtype the table did not time
            return True
        if half < 0.95 * full:
            return True
    return False


# ============================================================================ study plumbing


def _storage(storage: Any) -> Any:
    """Returns an Optuna storage: journal for `.log` paths and `journal://` URLs, else as given."""
    if storage is None or not isinstance(storage, (str, os.PathLike)):
        return storage
    text = os.fspath(storage)
    if text.startswith("journal://"):
        text = text[len("journal://") :]
        if text.startswith("/") and text.startswith("//"):
            text = text[1:]
    elif not text.endswith(".log"):
        return text
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(text))


class _FidelityPruner(optuna.pruners.BasePruner):
    """Prunes plans that cannot beat the best plan within budget, or whose proxy is hopeless.

    After the cost step: a non-warm-start plan predicted no faster than the best feasible
    plan so far is pruned. After the proxy step: non-finite loss or gradients, a proxy
    error above `proxy_tolerance`, or one at least as bad as that of a plan that already
    missed the budget (and worse than every plan that met it) is pruned.
    """

    def __init__(self, proxy_tolerance: float) -> None:
        self.proxy_tolerance = proxy_tolerance

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step == _COST_STEP:
            if trial.user_attrs.get("warm_start"):
                return False
            best = _best_feasible(study)
            value = trial.intermediate_values.get(_COST_STEP)
            return best is not None and value is not None and value >= best.value
        if step == _PROXY_STEP:
            score = trial.user_attrs.get("proxy_score")
            if score is None or not math.isfinite(score):
                return True
            if score > self.proxy_tolerance:
                return True
            passed, failed = [], []
            for other in study.get_trials(
                deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)
            ):
                other_score = other.user_attrs.get("proxy_score")
                if other_score is None:
                    continue
                (passed if _is_feasible(other) else failed).append(other_score)
            worst_pass = max(passed, default=-math.inf)
            best_fail = min(failed, default=math.inf)
            return score >= best_fail and score > worst_pass
        return False


def _is_feasible(trial: optuna.trial.FrozenTrial) -> bool:
    constraints = trial.constraints
    return bool(constraints) and all(value <= 0 for value in constraints.values())


def _best_feasible(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    feasible = [
        trial
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if _is_feasible(trial) and trial.value is not None
    ]
    return min(feasible, key=lambda trial: (trial.value, trial.number), default=None)


def _open_study(
    storage: Any, study_name: str | None, seed: int | None, proxy_tolerance: float
) -> tuple[optuna.Study, bool]:
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=6, multivariate=False)
    pruner = _FidelityPruner(proxy_tolerance)
    arguments = dict(
        storage=storage, study_name=study_name, sampler=sampler, pruner=pruner, direction="minimize"
    )
    if storage is None:
        return optuna.create_study(**arguments), True
    try:
        return optuna.create_study(load_if_exists=False, **arguments), True
    except optuna.exceptions.DuplicatedStudyError:
        return optuna.load_study(
            study_name=study_name, storage=storage, sampler=sampler, pruner=pruner
        ), False


def _enqueue_warm_starts(study: optuna.Study, warm: list[tuple[str, dict[str, str]]]) -> int:
    """Enqueues warm-start plans not already in the study (any state); returns how many."""
    existing = [trial.params for trial in study.get_trials(deepcopy=False)]
    existing += [
        trial.system_attrs.get("fixed_params")
        for trial in study.get_trials(deepcopy=False)
        if trial.system_attrs.get("fixed_params")
    ]
    added = 0
    for label, params in warm:
        if any(params == other for other in existing):
            continue
        study.enqueue_trial(params, user_attrs={"warm_start": label})
        existing.append(params)
        added += 1
    return added


# ============================================================================ search


@dataclasses.dataclass
class _Context:
    """Everything a trial needs, built once per `search()` call."""

    model: Any
    infos: Mapping[str, LayerInfo]
    compute: list[str]
    groups: list[space_module.Group]
    allowed: dict[str, tuple[str, ...]]
    evaluator: Evaluator
    costs: _Costs
    budget: Budget
    reference: float
    float32_seconds: float
    verbose: int
    cache: dict[tuple, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def assignment(self, params: Mapping[str, str]) -> dict[str, str]:
        dtypes = {}
        for group in self.groups:
            choice = params.get(group.name, group.choices[0])
            for path in group.paths:
                dtypes[path] = space_module.resolve_member(choice, self.allowed[path])
        return dtypes

    def plan(self, params: Mapping[str, str], **kwargs: Any) -> PrecisionPlan:
        return _plan_from_assignment(self.model, self.infos, self.assignment(params), **kwargs)

    def uniform_params(self, dtype: str) -> dict[str, str]:
        return {
            group.name: space_module.resolve_member(dtype, group.choices)
            for group in self.groups
            if len(group.choices) > 1
        }


def _objective(context: _Context, trial: optuna.Trial) -> float:
    params = {
        group.name: trial.suggest_categorical(group.name, list(group.choices))
        for group in context.groups
        if len(group.choices) > 1
    }
    assignment = context.assignment(params)
    counts = {dtype: list(assignment.values()).count(dtype) for dtype in COMPUTE_DTYPES}
    seconds, activation_bytes = context.costs.step(assignment)
    value = seconds * (1.0 + _MEMORY_TIE_BREAK * activation_bytes / _max_activation(context))
    trial.set_user_attr("dtype_counts", counts)
    trial.set_user_attr("predicted_seconds", seconds)
    trial.set_user_attr("activation_bytes_per_sample", activation_bytes)
    levels = ["profile"]
    trial.set_user_attr("fidelity", levels)
    key = tuple(sorted(assignment.items()))
    if key in context.cache:
        return _reuse(context, trial, context.cache[key], value)
    trial.report(value, _COST_STEP)
    if trial.should_prune():
        trial.set_user_attr("pruned_by", "cost: no faster than the best plan within budget")
        raise optuna.TrialPruned()

    plan = context.plan(params)
    proxy = None
    if keras.backend.backend() == "tensorflow":
        proxy = context.evaluator.proxy(plan)
        levels.append("proxy")
        trial.set_user_attr("fidelity", levels)
        trial.set_user_attr("proxy", proxy.to_dict())
        trial.set_user_attr("proxy_score", proxy.score if math.isfinite(proxy.score) else None)
        trial.report(value, _PROXY_STEP)
        if trial.should_prune():
            trial.set_user_attr("pruned_by", "proxy: loss/gradients too far from float32")
            trial.set_constraint("budget", _HUGE_VIOLATION if not proxy.finite else 1.0)
            raise optuna.TrialPruned()
    else:
        trial.set_user_attr("proxy_skipped", "the numerical proxy needs the TensorFlow backend")

    metrics = context.evaluator.train_and_evaluate(plan)
    levels.append("train")
    outcome = {
        "metrics": metrics,
        "proxy": proxy.to_dict() if proxy is not None else None,
        "proxy_score": proxy.score if proxy is not None else None,
    }
    context.cache[key] = outcome
    return _record_outcome(context, trial, outcome, value, levels)


def _max_activation(context: _Context) -> float:
    _, float32_bytes = context.costs.step({path: FLOAT32 for path in context.compute})
    return max(float32_bytes, 1.0)


def _reuse(context: _Context, trial: optuna.Trial, outcome: dict, value: float) -> float:
    trial.set_user_attr("reused", True)
    trial.set_user_attr("proxy", outcome.get("proxy"))
    score = outcome.get("proxy_score")
    trial.set_user_attr(
        "proxy_score", score if score is not None and math.isfinite(score) else None
    )
    return _record_outcome(context, trial, outcome, value, ["profile", "proxy", "train"])


def _record_outcome(
    context: _Context, trial: optuna.Trial, outcome: dict, value: float, levels: list[str]
) -> float:
    metric = outcome["metrics"].get(context.budget.log_name)
    violation = context.budget.violation(context.reference, metric)
    trial.set_user_attr("fidelity", levels)
    trial.set_user_attr("metrics", {k: _json_safe(v) for k, v in outcome["metrics"].items()})
    trial.set_user_attr("metric", _json_safe(metric))
    trial.set_user_attr("budget_violation", violation)
    trial.set_constraint("budget", violation)
    return value


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _log_trial(context: _Context, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    if not context.verbose:
        return
    attrs = trial.user_attrs
    counts = attrs.get("dtype_counts") or {}
    fidelity = (attrs.get("fidelity") or ["-"])[-1]
    metric = attrs.get("metric")
    seconds = attrs.get("predicted_seconds")
    verdict = {
        optuna.trial.TrialState.COMPLETE: "ok" if _is_feasible(trial) else "over budget",
        optuna.trial.TrialState.PRUNED: f"pruned ({attrs.get('pruned_by', '')})",
        optuna.trial.TrialState.FAIL: "failed",
    }.get(trial.state, str(trial.state))
    logger.info(
        "trial %d: %s | fidelity %s | %s %s | predicted %s%s | %s",
        trial.number,
        _counts_text(counts),
        fidelity,
        context.budget.metric,
        f"{metric:.6g}" if isinstance(metric, (int, float)) else "n/a",
        f"{seconds * 1e3:.3f} ms" if isinstance(seconds, (int, float)) else "n/a",
        f" (x{context.float32_seconds / seconds:.2f})" if seconds else "",
        verdict,
    )


def _plan_writer(context: _Context, plan_path: Any, metadata: dict) -> Callable:
    written: dict[str, Any] = {"number": None}

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        _log_trial(context, study, trial)
        if plan_path is None:
            return
        best = _best_feasible(study)
        if best is None or best.number == written["number"]:
            return
        plan = context.plan(best.params, metadata=_trial_metadata(context, best, metadata))
        plan.save(plan_path)
        written["number"] = best.number
        logger.info(
            "autoprec.search: best plan so far (trial %d) written to %s", best.number, plan_path
        )

    return callback


def _trial_metadata(context: _Context, trial: optuna.trial.FrozenTrial, base: dict) -> dict:
    seconds = trial.user_attrs.get("predicted_seconds")
    return {
        **base,
        "reference_metric": context.reference,
        "measured_metric": trial.user_attrs.get("metric"),
        "predicted_speedup": (context.float32_seconds / seconds) if seconds else None,
        "search": {**base.get("search", {}), "best_trial": trial.number},
    }


def search(
    model,
    train_data: Any,
    val_data: Any,
    budget: Budget,
    hardware: Any = "local",
    n_trials: int = 30,
    timeout: float | None = None,
    storage: Any = None,
    study_name: str | None = None,
    seed: int | None = 0,
    train_steps: int = 20,
    batch_size: int = 32,
    cost_batch_size: int | None = None,
    dtypes: Sequence[str] | None = None,
    group_by: str | int = "auto",
    profile: Any = None,
    profile_steps: int = 4,
    costs: Any = None,
    keep_float32: Sequence[str] = (),
    proxy_batches: int = 2,
    proxy_tolerance: float = 0.5,
    val_steps: int | None = None,
    reference_repeats: int = 0,
    plan_path: str | os.PathLike | None = None,
    measure_speedup: bool | None = None,
    catch: Iterable[type[BaseException]] = (Exception,),
    callbacks: Sequence[Callable] = (),
    show_progress_bar: bool = False,
    verbose: int = 1,
) -> SearchResult:
    """Searches the cheapest dtype per layer whose short-training metric stays within `budget`.

    The user's model is left unchanged: trials run on a clone
    (`keras.models.clone_model`, same weights, recompiled with a fresh copy of the
    optimizer from its config and the same loss and metrics). Subclassed models
    need `get_config` to be cloned; without it the search works on the model itself
    and puts back its weights and policies at the end (its optimizer is never used).

    Args:
        model: a built, compiled Keras model.
        train_data: `(x, y)` numpy arrays or a `tf.data.Dataset` of `(x, y)` batches;
            the first `train_steps` batches are trained on, in order, by every trial.
        val_data: the same kinds; the budget metric is evaluated on it.
        budget: a `Budget`.
        hardware: `"local"` (per-layer costs measured on this device with
            `autoprec.calibrate`), or a hardware profile name/object such as
            `"rtx4090"` (costs predicted with `autoprec.cost.predict_costs`).
        n_trials: trials to run in this call (added to those already in the study).
        timeout: stop starting trials after this many seconds.
        storage: any Optuna storage: URL (`"sqlite:///autoprec.db"`, PostgreSQL), a
            journal file (`"journal:///path/file.log"` or a path ending `.log`), or a
            storage object. The same storage and `study_name` resume the study; several
            processes may share one.
        study_name: the study's name (required to resume from a storage).
        seed: seeds the sampler and every evaluation (deterministic per machine).
        train_steps: S, the training steps of level 3.
        batch_size: batch size for numpy data (datasets keep their own batches).
        cost_batch_size: batch size the step time is predicted for (the batch you
            will train with); default `batch_size`.
        dtypes: dtypes the search may use. Default: float32 plus the 16-bit dtypes
            that run fast on `hardware` (for `"local"`: measured faster than float32 for
            this model; on a CPU without native float16 that leaves float16 out). An
            explicit list is respected even where a dtype is slow.
        group_by: `"layer"`, `"block"`, `"auto"` or an int (max groups); see
            `autoprec._search_space.group_layers`.
        profile: an `autoprec.profiler.Profile`; default profiled here when the profiler
            is available (float16 ruled out for layers whose ranges do not fit).
        profile_steps: batches the profiler sees.
        costs: a `CostTable` to use instead of calibrating/predicting.
        keep_float32: globs on paths or class names that always stay float32.
        proxy_batches: calibration batches of the numerical proxy (level 2).
        proxy_tolerance: proxy relative error above which a plan is pruned.
        val_steps: validation batches to evaluate (default all).
        reference_repeats: extra float32 runs with other batch orders and seeds, to
            report the reference's spread; a budget tighter than it is warned about.
        plan_path: the best plan so far is written there (atomically) after every
            trial that improves it, and the final plan at the end.
        measure_speedup: time the final plan and float32 on this device (default:
            when `hardware="local"`).
        catch: exceptions that mark a trial failed instead of stopping the search.
        callbacks: extra Optuna callbacks `(study, frozen_trial)`.
        show_progress_bar: Optuna's progress bar.
        verbose: 0 silent, 1 one log line per trial (logger `"autoprec"`), 2 also
            calibration progress.

    Returns:
        A `SearchResult`.

    Raises:
        AutoprecError: the budget metric is not reported by the model (the message
            lists those that are), or the model is not compiled.

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
    _set_verbosity(verbose)
    seed_value = 0 if seed is None else int(seed)
    train_batches = _take_batches(train_data, batch_size, train_steps, "train_data")
    val_batches = _take_batches(val_data, batch_size, val_steps, "val_data")
    evaluator = Evaluator(model, train_batches, val_batches, proxy_batches, seed_value)
    try:
        _check_metric(evaluator, budget)
        return _run_search(**locals())
    finally:
        evaluator.close()


def _set_verbosity(verbose: int) -> None:
    if verbose and not logger.handlers and not logging.getLogger().handlers:
        logging.basicConfig(format="%(message)s")
    if verbose and logger.level in (logging.NOTSET,) or (verbose and logger.level > logging.INFO):
        logger.setLevel(logging.INFO)
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _check_metric(evaluator: Evaluator, budget: Budget) -> None:
    names = evaluator.metric_names()
    if budget.log_name not in names:
        available = ", ".join(f"val_{name}" for name in names)
        raise AutoprecError(
            f"Budget metric {budget.metric!r} is not reported by the model; it reports "
            f"{available} on validation data. Add the metric in model.compile(metrics=[...]) "
            "or pick one of these."
        )


def _run_search(**arguments: Any) -> SearchResult:
    model = arguments["model"]
    evaluator: Evaluator = arguments["evaluator"]
    budget: Budget = arguments["budget"]
    verbose = arguments["verbose"]
    infos = describe_model(model)
    compute = space_module.compute_layers(infos)

    hardware_profile, table = (None, arguments["costs"])
    if table is None:
        hardware_profile, table = _load_costs(
            evaluator.model,
            arguments["hardware"],
            evaluator.train_batches[0],
            arguments["dtypes"],
            verbose,
            arguments["cost_batch_size"] or evaluator.batch_size,
        )
    elif isinstance(arguments["hardware"], str) and arguments["hardware"] != "local":
        hardware_profile = _resolve_hardware(arguments["hardware"])
    dtypes = _default_dtypes(arguments["dtypes"], hardware_profile, table)
    costs = _Costs(evaluator.model, table, arguments["cost_batch_size"] or evaluator.batch_size)

    profile = arguments["profile"]
    if profile is None and FLOAT16 in dtypes:
        profile = space_module.run_profiler(
            evaluator.model,
            (evaluator.train_x, evaluator.train_y),
            arguments["profile_steps"],
            evaluator.batch_size,
        )
    unsafe = space_module.float16_unsafe_layers(profile)
    allowed, removed = space_module.allowed_dtypes(
        compute, infos, dtypes, unsafe, arguments["keep_float32"]
    )
    outputs = space_module.output_layers(model, infos)
    grouped = space_module.group_layers(compute, arguments["group_by"], separate=outputs)
    groups = space_module.make_groups(grouped, allowed)

    reference_metrics = evaluator.train_and_evaluate(
        PrecisionPlan.uniform(evaluator.model, FLOAT32)
    )
    reference = reference_metrics[budget.log_name]
    if not math.isfinite(reference):
        raise AutoprecError(
            f"search: the float32 reference's {budget.metric} is {reference}; the model does "
            "not train stably in float32 with these settings, so no budget can be checked."
        )
    spread = _reference_spread(evaluator, budget, reference, arguments["reference_repeats"])
    float32_seconds, _ = costs.step({path: FLOAT32 for path in compute})
    context = _Context(
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
    )
    context.cache[tuple(sorted({p: FLOAT32 for p in compute}.items()))] = {
        "metrics": reference_metrics,
        "proxy": {"loss_relative_error": 0.0, "gradient_cosine": 1.0, "finite": True},
        "proxy_score": 0.0,
    }
    if verbose:
        logger.info(
            "autoprec.search: %d compute layers in %d groups; dtypes %s; float32 reference "
            "%s = %.6g (budget %s %.6g); predicted float32 step %.3f ms (%s costs)",
            len(compute),
            len(groups),
            "/".join(dtypes),
            budget.metric,
            reference,
            ">=" if budget.direction == "higher" else "<=",
            budget.threshold(reference),
            float32_seconds * 1e3,
            getattr(table, "source", "no"),
        )

    storage = _storage(arguments["storage"])
    study, created = _open_study(
        storage, arguments["study_name"], arguments["seed"], arguments["proxy_tolerance"]
    )
    study.set_user_attr("reference_metric", reference)
    warm = _warm_starts(context, model, profile, table, hardware_profile, dtypes, arguments)
    added = _enqueue_warm_starts(study, warm)
    if verbose:
        logger.info(
            "autoprec.search: study %r (%s, %d trial(s) already); %d warm start(s) enqueued",
            study.study_name,
            "new" if created else "resumed",
            len(study.trials) - added,
            added,
        )

    base_metadata = {
        "hardware": getattr(hardware_profile, "name", None) or str(arguments["hardware"]),
        "budget": {**budget.to_dict(), "reference_spread": spread},
        "search": {
            "study_name": study.study_name,
            "seed": arguments["seed"],
            "train_steps": len(evaluator.train_batches),
            "batch_size": evaluator.batch_size,
            "dtypes": list(dtypes),
            "groups": len(groups),
            "cost_source": getattr(table, "source", None),
        },
    }
    n_trials = arguments["n_trials"]
    if all(len(group.choices) <= 1 for group in groups):
        logger.info("autoprec.search: nothing to choose (one dtype per layer); one trial only.")
        n_trials = min(n_trials or 1, 1)
    writer = _plan_writer(context, arguments["plan_path"], base_metadata)
    study.optimize(
        lambda trial: _objective(context, trial),
        n_trials=n_trials,
        timeout=arguments["timeout"],
        catch=tuple(arguments["catch"]),
        callbacks=[writer, *arguments["callbacks"]],
        show_progress_bar=arguments["show_progress_bar"],
    )
    return _finish(context, study, base_metadata, spread, table, removed, unsafe, arguments)


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
    context: _Context, model, profile, table, hardware_profile, dtypes, arguments
) -> list[tuple[str, dict[str, str]]]:
    warm = [("float32", context.uniform_params(FLOAT32))]
    for dtype in (BFLOAT16, FLOAT16):
        if dtype in dtypes:
            warm.append((f"uniform {dtype}", context.uniform_params(dtype)))
    heuristic = heuristic_plan(
        model,
        profile=profile,
        costs=table,
        hardware=hardware_profile,
        dtypes=dtypes,
        keep_float32=None,
    )
    params = {}
    for group in context.groups:
        if len(group.choices) <= 1:
            continue
        chosen = [heuristic.layers.get(path, FLOAT32) for path in group.paths]
        majority = max(group.choices, key=lambda dtype: (chosen.count(dtype), dtype == FLOAT32))
        params[group.name] = majority
    warm.append(("heuristic", params))
    unique: list[tuple[str, dict[str, str]]] = []
    for label, entry in warm:
        if all(entry != other for _, other in unique):
            unique.append((label, entry))
    return unique


def _finish(
    context, study, base_metadata, spread, table, removed, unsafe, arguments
) -> SearchResult:
    best = _best_feasible(study)
    points = _points(context, study)
    if best is None:
        logger.warning(
            "autoprec.search: no plan met the budget in %d trial(s); returning float32.",
            len(study.trials),
        )
        params = context.uniform_params(FLOAT32)
        trial_metadata = {
            **base_metadata,
            "reference_metric": context.reference,
            "measured_metric": context.reference,
            "predicted_speedup": 1.0,
        }
    else:
        params = best.params
        trial_metadata = _trial_metadata(context, best, base_metadata)
    plan = context.plan(params)
    local = arguments["costs"] is None and (
        arguments["hardware"] is None or str(arguments["hardware"]).lower() == "local"
    )
    measure = arguments["measure_speedup"] if arguments["measure_speedup"] is not None else local
    measured_speedup = None
    if measure:
        plan, trial_metadata, timed = _confirm_by_measurement(
            context, study, plan, trial_metadata, base_metadata
        )
        measured_speedup = timed["float32"] / timed["chosen"]
        trial_metadata["search"] = {
            **trial_metadata.get("search", {}),
            "measured_float32_step_seconds": timed["float32"],
            "measured_plan_step_seconds": timed["chosen"],
            "measured_step_seconds": {k: v for k, v in timed.items() if k != "chosen"},
        }
    trial_metadata["measured_speedup"] = measured_speedup
    trial_metadata["evidence"] = _evidence(context, table, removed, unsafe)
    trial_metadata["search"] = {
        **trial_metadata.get("search", {}),
        "trials": len(study.trials),
        "complete": sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials),
        "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials),
        "failed": sum(t.state == optuna.trial.TrialState.FAIL for t in study.trials),
        "wall_seconds": time.perf_counter() - arguments["started"],
        "fidelity": "train",
    }
    plan = plan.with_metadata(**trial_metadata)
    if arguments["plan_path"] is not None:
        plan.save(arguments["plan_path"])
    return SearchResult(
        plan=plan,
        study=study,
        budget=context.budget,
        reference_metric=context.reference,
        reference_spread=spread,
        points=points,
        float32_predicted_seconds=context.float32_seconds,
    )


#: A uniform plan replaces the searched plan only when measured this much faster (noise margin).
_MEASURED_MARGIN = 0.03


def _confirm_by_measurement(
    context, study, plan: PrecisionPlan, trial_metadata: dict, base_metadata: dict
) -> tuple[PrecisionPlan, dict, dict[str, float]]:
    """Times the searched plan beside float32 and every uniform plan within budget, interleaved.

    Per-layer costs can rank a mixed plan ahead of a uniform one that the whole
    step runs faster; the measured step has the last word. A uniform plan
    measured more than `_MEASURED_MARGIN` faster than the searched plan replaces it.
    """
    candidates: dict[str, tuple[PrecisionPlan, Any]] = {
        "searched": (plan, None),
        "float32": (context.plan(context.uniform_params(FLOAT32)), None),
    }
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        label = str(trial.user_attrs.get("warm_start", ""))
        if label.startswith("uniform") and label != "uniform float32" and _is_feasible(trial):
            candidates[label] = (context.plan(trial.params), trial)
    names = list(candidates)
    seconds = measure_step_seconds(context.evaluator, [candidates[name][0] for name in names])
    timed = dict(zip(names, seconds))
    fastest = min(timed, key=timed.get)
    if fastest != "searched" and timed[fastest] < timed["searched"] * (1 - _MEASURED_MARGIN):
        logger.info(
            "autoprec.search: %s measured %.1f%% faster than the searched plan; using it.",
            fastest,
            100 * (1 - timed[fastest] / timed["searched"]),
        )
        plan, trial = candidates[fastest]
        if trial is not None:
            trial_metadata = _trial_metadata(context, trial, base_metadata)
        else:
            trial_metadata = {
                **base_metadata,
                "reference_metric": context.reference,
                "measured_metric": context.reference,
                "predicted_speedup": 1.0,
            }
        trial_metadata["search"] = {
            **trial_metadata.get("search", {}),
            "replaced_by_measurement": fastest,
        }
        timed["chosen"] = timed[fastest]
    else:
        timed["chosen"] = timed["searched"]
    return plan, trial_metadata, timed


def measure_step_seconds(
    evaluator: Evaluator, plans: Sequence[PrecisionPlan], rounds: int = 3
) -> list[float]:
    """Times each plan's train step in interleaved rounds; returns the fastest median per plan."""
    best = [math.inf] * len(plans)
    for _ in range(rounds):
        for index, plan in enumerate(plans):
            best[index] = min(best[index], evaluator.step_seconds(plan, steps=5, warmup=3))
    return best


def _points(context: _Context, study: optuna.Study) -> list[ParetoPoint]:
    points = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        metric = trial.user_attrs.get("metric")
        seconds = trial.user_attrs.get("predicted_seconds")
        if seconds is None:
            continue
        points.append(
            ParetoPoint(
                trial=trial.number,
                predicted_seconds=float(seconds),
                metric=float(metric) if metric is not None else math.nan,
                feasible=_is_feasible(trial),
                counts=dict(trial.user_attrs.get("dtype_counts") or {}),
            )
        )
    return points


def _evidence(context: _Context, table, removed, unsafe) -> dict[str, Any]:
    evidence: dict[str, Any] = {}
    for path in context.compute:
        entry: dict[str, Any] = {"allowed": list(context.allowed[path])}
        if path in removed:
            entry["removed"] = removed[path]
        seconds = {dtype: context.costs.layer_seconds(path, dtype) for dtype in COMPUTE_DTYPES}
        seconds = {dtype: value for dtype, value in seconds.items() if value is not None}
        if seconds:
            entry["seconds"] = seconds
        if path in unsafe:
            entry["profile"] = unsafe[path]
        evidence[path] = entry
    return evidence
