"""What `search()` returns: `SearchResult`, its `ParetoPoint`s, the report text and the optional
plot."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping

import optuna

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32
from ..errors import AutoprecError
from ..plan import PrecisionPlan
from .budget import Budget

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
        for point in self.pareto:
            speedup = self.float32_predicted_seconds / max(point.predicted_seconds, 1e-12)
            lines.append(
                f"{point.trial:>5}  {point.predicted_seconds * 1e3:>9.3f}ms  {speedup:>6.2f}x  "
                f"{point.metric:>14.6g}  {'yes' if point.feasible else 'no':>3}  "
                f"{short_counts_text(point.counts)}"
            )
        warm = [point for point in self.points if point.label]
        search = metadata.get("search") or {}
        measurement = search.get("measurement") or {}
        medians = measurement.get("median_seconds") or {}
        if warm:
            fastest = search.get("measured_step_seconds") or {}
            lines.append("finalists (warm starts and plans added after the trials, ungrouped):")
            for point in sorted(warm, key=lambda p: p.trial):
                speedup = self.float32_predicted_seconds / max(point.predicted_seconds, 1e-12)
                lines.append(
                    f"{point.trial:>5}  {point.predicted_seconds * 1e3:>9.3f}ms  {speedup:>6.2f}x  "
                    f"{point.metric:>14.6g}  {'yes' if point.feasible else 'no':>3}  "
                    f"{point.label}: {short_counts_text(point.counts)}"
                    + _measured_text(medians.get(point.label), fastest.get(point.label))
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


def short_counts_text(counts: Mapping[str, int]) -> str:
    """Returns `"2 bf16 / 1 f32 / 0 f16"`: layer counts of bfloat16, float32 and float16 (and float8
    when any)."""
    shown = (
        (BFLOAT16, FLOAT32, FLOAT16, FLOAT8) if counts.get(FLOAT8) else (BFLOAT16, FLOAT32, FLOAT16)
    )
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
