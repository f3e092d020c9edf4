"""What the search keeps per trial (`TrialRecord`) and what it returns (`SearchResult`, its report)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import optuna

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32, policy_name
from ..errors import AutoprecError
from ..plan import PrecisionPlan
from .budget import Budget


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """What one trial evaluated and found, as its `user_attrs` (one per field, under its name);
    unset fields (`None`, empty, False) are not written, so one stage writes only its fields."""

    assignment: Mapping[str, str] | None = None  # {compute path: dtype} evaluated
    assignment_key: str | None = None
    train_steps: int | None = None  # the fidelity it was trained at
    warm_start: str | None = None  # "float32", "heuristic", "keras mixed_bfloat16"...
    neighbour: str | None = None  # the move, e.g. "dense+3 -> bfloat16"
    evaluating: int | None = None  # its own number, once it evaluates the plan itself
    dtype_counts: Mapping[str, int] | None = None
    predicted_seconds: float | None = None
    activation_bytes_per_sample: float | None = None
    fidelity: tuple[str, ...] = ()  # levels reached: "profile", "proxy", "train"
    pruned_by: str | None = None
    proxy: Mapping[str, Any] | None = None  # ProxyResult.to_dict()
    proxy_score: float | None = None
    proxy_skipped: str | None = None
    metrics: Mapping[str, float | None] | None = None
    metric: float | None = None
    budget_violation: float | None = None  # > 0: the metric missed the budget
    reused: bool = False
    reused_from: int | str | None = None  # the trial it reused, or "reference"

    @classmethod
    def from_trial(cls, trial: optuna.trial.FrozenTrial | optuna.Trial) -> TrialRecord:
        """Returns the record of a trial, finished or running (other user attrs are ignored)."""
        attrs = trial.user_attrs
        values = {field.name: attrs[field.name] for field in _FIELDS if field.name in attrs}
        values["fidelity"] = tuple(values.pop("fidelity", None) or ())
        values["reused"] = bool(values.get("reused"))
        return cls(**values)

    def to_user_attrs(self, *, with_none: Iterable[str] = ()) -> dict[str, Any]:
        """Returns `{field: JSON value}` of the fields set (or named in `with_none`), tuples as lists."""
        keep = set(with_none)
        unknown = keep - {field.name for field in _FIELDS}
        if unknown:
            raise ValueError(f"TrialRecord has no field {sorted(unknown)[0]!r}.")
        attrs = {}
        for field in _FIELDS:
            key = field.name
            value = getattr(self, key)
            if (value is None and key not in keep) or value is False or value == ():
                continue
            if isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            attrs[key] = value
        return attrs

    @property
    def label(self) -> str | None:
        """The warm start's label or the neighbour's move; `None` for a sampled trial."""
        return self.warm_start or self.neighbour

    @property
    def trained_here(self) -> bool:
        """Whether the trial trained its assignment itself (has metrics, reused nothing)."""
        return self.metrics is not None and self.reused_from is None


#: The user attrs a `TrialRecord` reads and writes: one per field, under the field's name.
_FIELDS = dataclasses.fields(TrialRecord)


def write_record(
    trial: optuna.Trial, record: TrialRecord, *, with_none: Iterable[str] = ()
) -> None:
    """Sets the fields a record holds as the running trial's user attrs (the others stay)."""
    for key, value in record.to_user_attrs(with_none=with_none).items():
        trial.set_user_attr(key, value)


def assignment_key(assignment: Mapping[str, str]) -> str:
    """Returns a short stable digest of a per-layer assignment (equal assignments, equal keys)."""
    text = json.dumps(sorted(assignment.items()), separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()[:20]


#: The name of the best plan by predicted cost when it is no warm start.
SEARCHED = "searched"
#: Prefix of the labels of Keras' own global policies (`"keras mixed_bfloat16"`).
KERAS_PREFIX = "keras "
#: Prefix of the uniform warm starts' labels (`"uniform bfloat16"`).
UNIFORM_PREFIX = "uniform "
#: The heuristic's warm start label.
HEURISTIC = "heuristic"
#: Prefix of the labels of plans with one kind of float32 protection dropped.
DROPPED_PREFIX = "no float32 "
#: The kinds of default float32 protections, in the order their candidates are made.
PROTECTION_KINDS = ("softmax", "normalisation", "outputs")


def keras_label(dtype: str) -> str:
    """Returns the label of Keras' global policy for `dtype`: `"keras mixed_bfloat16"`."""
    return f"{KERAS_PREFIX}{policy_name(dtype)}"


def keras_dtype(label: str | None) -> str | None:
    """Returns the dtype of a Keras global label (`"float8"` for `float8_from_mixed_bfloat16`)."""
    return next(
        (dtype for dtype in (BFLOAT16, FLOAT16, FLOAT8) if label == keras_label(dtype)), None
    )


def plan_default(dtype: str) -> str:
    """The default of a Keras global plan: `dtype`, or bfloat16 (float8's source) for float8."""
    return BFLOAT16 if dtype == FLOAT8 else dtype


def dropped_label(kind: str) -> str:
    """Returns the label of the plan with one protection kind dropped: `"no float32 softmax"`."""
    return f"{DROPPED_PREFIX}{kind}"


def simplicity(name: str) -> int:
    """Returns how simple a finalist is (lower is simpler): ties in the measured ranking go lower."""
    if name == FLOAT32:
        return 0
    if name.startswith((KERAS_PREFIX, UNIFORM_PREFIX)):
        return 1
    if name == HEURISTIC:
        return 2
    if name.startswith(DROPPED_PREFIX):
        return 3
    return 4


_SHORT_NAMES = {FLOAT32: "f32", BFLOAT16: "bf16", FLOAT16: "f16", FLOAT8: "f8"}


@dataclasses.dataclass(frozen=True)
class ParetoPoint:
    """One evaluated plan: predicted step time against the budget metric."""

    trial: int
    predicted_seconds: float
    metric: float
    feasible: bool
    counts: dict[str, int]
    label: str | None = None


@dataclasses.dataclass(frozen=True)
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

    Example:

    ```python
    result = autoprec.search(model, (x, y), (x_val, y_val), autoprec.Budget("val_loss", max_drop=0.1))
    print(result.report())
    fastest = result.pareto[0]
    ```
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
        better = (lambda a, b: a > b) if self.budget.mode == "max" else (lambda a, b: a < b)
        front: list[ParetoPoint] = []
        finite = [p for p in self.points if math.isfinite(p.metric)]
        for point in sorted(finite, key=lambda p: (p.predicted_seconds, p.trial)):
            if not front or better(point.metric, front[-1].metric):
                front.append(point)
        return front

    def report(self, plot_path: str | os.PathLike | None = None) -> str:
        """Returns a text table of the Pareto front and the chosen plan; optionally plots it.

        Args:
            plot_path: if given, a matplotlib figure of all points and the front is
                saved there (needs `pip install autoprec[plot]`).

        Returns:
            The report text.

        Raises:
            AutoprecError: `plot_path` is given and matplotlib is not installed.
        """
        metadata = self.plan.metadata
        lines = [
            f"autoprec search: {len(self.study.trials)} trial(s), budget "
            f"{self.budget.metric} {'>=' if self.budget.mode == 'max' else '<='} "
            f"{self.budget.threshold(self.reference_metric):.6g} "
            f"(float32 reference {self.reference_metric:.6g}"
            + (f" ± {self.reference_spread:.3g}" if self.reference_spread is not None else "")
            + ")",
            f"{'trial':>5}  {'pred. step':>11}  {'speedup':>7}  {self.budget.metric:>14}  "
            f"{'ok':>3}  dtypes",
        ]
        lines += [self._row(point, short_counts_text(point.counts)) for point in self.pareto]
        warm = [point for point in self.points if point.label]
        search = metadata.get("search") or {}
        measurement = search.get("measurement") or {}
        medians = measurement.get("median_seconds") or {}
        if warm:
            fastest = search.get("measured_step_seconds") or {}
            lines.append("finalists (warm starts and plans added after the trials, ungrouped):")
            for point in sorted(warm, key=lambda p: p.trial):
                measured = _measured_text(medians.get(point.label), fastest.get(point.label))
                lines.append(
                    self._row(point, f"{point.label}: {short_counts_text(point.counts)}{measured}")
                )
        if measurement.get("verdict"):
            lines.append(measurement_text(measurement))
        lines.append(
            f"chosen: {short_counts_text(self.plan.dtype_counts())}; metric "
            f"{_number_text(metadata.get('measured_metric'))}, predicted speedup "
            f"{_number_text(metadata.get('predicted_speedup'))}, measured speedup "
            f"{_number_text(metadata.get('measured_speedup'))}"
        )
        if plot_path is not None:
            _plot(self, plot_path)
            lines.append(f"plot: {plot_path}")
        return "\n".join(lines)

    def _row(self, point: ParetoPoint, dtypes: str) -> str:
        """One row of the report's table: trial, predicted step, speedup, metric, verdict."""
        speedup = self.float32_predicted_seconds / max(point.predicted_seconds, 1e-12)
        return (
            f"{point.trial:>5}  {point.predicted_seconds * 1e3:>9.3f}ms  {speedup:>6.2f}x  "
            f"{point.metric:>14.6g}  {'yes' if point.feasible else 'no':>3}  {dtypes}"
        )


def short_counts_text(counts: Mapping[str, int]) -> str:
    """Returns `"2 bf16 / 1 f32 / 0 f16"`: layer counts per dtype (float8 too when any)."""
    shown = (BFLOAT16, FLOAT32, FLOAT16) + ((FLOAT8,) if counts.get(FLOAT8) else ())
    return " / ".join(f"{counts.get(dtype, 0)} {_SHORT_NAMES[dtype]}" for dtype in shown)


def measurement_text(measurement: Mapping) -> str:
    """Returns the report's line on the measured ranking: rounds, leader, margin or tie."""
    medians = measurement.get("median_seconds") or {}
    count = max((measurement.get("rounds_timed") or {}).values(), default=0)
    leader = measurement.get("leader")
    head = f"measured: {count} interleaved round(s) of {len(medians)} plan(s); "
    if leader not in medians:
        return head + "no leader"
    against = ""
    if leader != FLOAT32 and _is_number(medians.get(FLOAT32)):
        against = f" ({medians[FLOAT32] / medians[leader]:.3g}x float32)"
    text = f"{leader} at {medians[leader] * 1e3:.4g} ms median{against}"
    if measurement.get("verdict") == "separated":
        return head + text + ", ahead of every other plan beyond the noise"
    tied = ", ".join(str(name) for name in measurement.get("contenders") or ())
    return head + f"a tie within the noise ({tied}): the simpler {text}"


def _measured_text(median: object, fastest: object) -> str:
    if _is_number(median):
        return f"; measured {median * 1e3:.3f} ms median"
    return f"; measured {fastest * 1e3:.3f} ms" if _is_number(fastest) else ""


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number_text(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "n/a"


def _plot(result: SearchResult, plot_path: str | os.PathLike) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError as error:
        raise AutoprecError(
            "report(plot_path=...) needs matplotlib: pip install autoprec[plot]"
        ) from error
    figure, axes = pyplot.subplots(figsize=(6, 4))
    finite = [p for p in result.points if math.isfinite(p.metric)]
    for feasible, colour in ((True, "tab:blue"), (False, "tab:red")):
        chosen = [p for p in finite if p.feasible == feasible]
        axes.scatter(
            [p.predicted_seconds * 1e3 for p in chosen],
            [p.metric for p in chosen],
            c=colour,
            s=16,
            label="within budget" if feasible else "over budget",
        )
    front = result.pareto
    axes.plot([p.predicted_seconds * 1e3 for p in front], [p.metric for p in front], "k--", lw=1)
    axes.axhline(result.budget.threshold(result.reference_metric), color="grey", lw=0.8)
    axes.set_xlabel("predicted step time (ms)")
    axes.set_ylabel(result.budget.metric)
    axes.legend()
    figure.tight_layout()
    figure.savefig(plot_path)
    pyplot.close(figure)
