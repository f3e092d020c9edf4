"""What the search keeps in Optuna's `user_attrs`: `TrialRecord`, `TrainedOutcome` and their keys."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import optuna

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32, policy_name

#: Trial user attr: the per-layer assignment `{compute path: dtype}` the trial evaluated.
ASSIGNMENT_ATTR = "assignment"
#: Trial user attr: `assignment_key(assignment)`, equal for equal assignments.
ASSIGNMENT_KEY_ATTR = "assignment_key"
#: Trial user attr: training steps of the trial (the fidelity it was trained at).
TRAIN_STEPS_ATTR = "train_steps"
#: Trial user attr: the warm start's or finalist's label (`"float32"`, `"uniform bfloat16"`,
#: `"heuristic"`, `"keras mixed_bfloat16"`, `"no float32 softmax"`).
WARM_START_ATTR = "warm_start"
#: Trial user attr: the move of a neighbour trial, e.g. `"dense+3 -> bfloat16"`.
NEIGHBOUR_ATTR = "neighbour"
#: Trial user attr: the trial's own number, set once it evaluates its assignment itself.
EVALUATING_ATTR = "evaluating"
#: Trial user attr: `{dtype: number of compute layers}`.
DTYPE_COUNTS_ATTR = "dtype_counts"
#: Trial user attr: the predicted seconds per training step.
PREDICTED_SECONDS_ATTR = "predicted_seconds"
#: Trial user attr: predicted activation bytes per sample.
ACTIVATION_BYTES_ATTR = "activation_bytes_per_sample"
#: Trial user attr: the fidelity levels the trial reached (`"profile"`, `"proxy"`, `"train"`).
FIDELITY_ATTR = "fidelity"
#: Trial user attr: why the trial was pruned.
PRUNED_BY_ATTR = "pruned_by"
#: Trial user attr: the numerical proxy (`ProxyResult.to_dict()`).
PROXY_ATTR = "proxy"
#: Trial user attr: the proxy's score (`None` when not finite).
PROXY_SCORE_ATTR = "proxy_score"
#: Trial user attr: why the proxy was skipped (another backend than TensorFlow).
PROXY_SKIPPED_ATTR = "proxy_skipped"
#: Trial user attr: every validation metric after short training (`None` where not finite).
METRICS_ATTR = "metrics"
#: Trial user attr: the budget metric after short training (`None` when not finite).
METRIC_ATTR = "metric"
#: Trial user attr: by how much the metric misses the budget (> 0 violated).
BUDGET_VIOLATION_ATTR = "budget_violation"
#: Trial user attr: `True` when the trial reused another evaluation of its assignment.
REUSED_ATTR = "reused"
#: Trial user attr: the trial number it reused, or `"reference"` (the float32 reference).
REUSED_FROM_ATTR = "reused_from"

#: Study user attr: set once the warm starts are in the study.
WARM_STARTS_MARK = "warm_starts_enqueued"
#: Study user attr: the float32 reference's budget metric.
REFERENCE_METRIC_ATTR = "reference_metric"

#: The `TrialRecord` field each trial user attr key fills.
_FIELDS_BY_KEY = {
    ASSIGNMENT_ATTR: "assignment",
    ASSIGNMENT_KEY_ATTR: "assignment_key",
    TRAIN_STEPS_ATTR: "train_steps",
    WARM_START_ATTR: "warm_start",
    NEIGHBOUR_ATTR: "neighbour",
    EVALUATING_ATTR: "evaluating",
    DTYPE_COUNTS_ATTR: "dtype_counts",
    PREDICTED_SECONDS_ATTR: "predicted_seconds",
    ACTIVATION_BYTES_ATTR: "activation_bytes_per_sample",
    FIDELITY_ATTR: "fidelity",
    PRUNED_BY_ATTR: "pruned_by",
    PROXY_ATTR: "proxy",
    PROXY_SCORE_ATTR: "proxy_score",
    PROXY_SKIPPED_ATTR: "proxy_skipped",
    METRICS_ATTR: "metrics",
    METRIC_ATTR: "metric",
    BUDGET_VIOLATION_ATTR: "budget_violation",
    REUSED_ATTR: "reused",
    REUSED_FROM_ATTR: "reused_from",
}


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """What one trial of the search evaluated and found, as kept in its `user_attrs`.

    Every field is optional: a trial fills them stage by stage (a pruned trial has no
    metrics), and a record built to write a stage holds only that stage's fields.
    Unset fields are `None` (`fidelity`: empty, `reused`: `False`) and are not written.

    Attributes:
        assignment: `{compute path: dtype}` the trial evaluated.
        assignment_key: `assignment_key(assignment)`.
        train_steps: training steps of the trial.
        warm_start: the warm start's label, for a warm start.
        neighbour: the move, for a neighbour of the best plan.
        evaluating: the trial's own number once it evaluates its assignment itself.
        dtype_counts: `{dtype: number of compute layers}`.
        predicted_seconds: predicted seconds per training step.
        activation_bytes_per_sample: predicted activation bytes per sample.
        fidelity: the levels reached, in order (`"profile"`, `"proxy"`, `"train"`).
        pruned_by: why the trial was pruned.
        proxy: the numerical proxy, as `ProxyResult.to_dict()`.
        proxy_score: the proxy's score, `None` when not finite.
        proxy_skipped: why the proxy was skipped.
        metrics: every validation metric after training (`None` where not finite).
        metric: the budget metric after training (`None` when not finite).
        budget_violation: > 0 when the metric missed the budget.
        reused: whether the trial reused another evaluation of its assignment.
        reused_from: the trial it reused, or `"reference"`.

    Example:

    ```python
    record = TrialRecord.from_trial(result.study.best_trial)
    record.assignment, record.metric, record.label
    ```
    """

    assignment: Mapping[str, str] | None = None
    assignment_key: str | None = None
    train_steps: int | None = None
    warm_start: str | None = None
    neighbour: str | None = None
    evaluating: int | None = None
    dtype_counts: Mapping[str, int] | None = None
    predicted_seconds: float | None = None
    activation_bytes_per_sample: float | None = None
    fidelity: tuple[str, ...] = ()
    pruned_by: str | None = None
    proxy: Mapping[str, Any] | None = None
    proxy_score: float | None = None
    proxy_skipped: str | None = None
    metrics: Mapping[str, float | None] | None = None
    metric: float | None = None
    budget_violation: float | None = None
    reused: bool = False
    reused_from: int | str | None = None

    @classmethod
    def from_user_attrs(cls, attrs: Mapping[str, Any]) -> TrialRecord:
        """Returns the record held in a trial's `user_attrs` (other keys are ignored).

        Args:
            attrs: a trial's `user_attrs`.

        Returns:
            The `TrialRecord`.

        Example:

        ```python
        TrialRecord.from_user_attrs({"warm_start": "float32"}).label  # "float32"
        ```
        """
        values = {field: attrs[key] for key, field in _FIELDS_BY_KEY.items() if key in attrs}
        if values.get("fidelity") is not None:
            values["fidelity"] = tuple(values["fidelity"])
        else:
            values.pop("fidelity", None)
        values["reused"] = bool(values.get("reused"))
        return cls(**values)

    @classmethod
    def from_trial(cls, trial: optuna.trial.FrozenTrial | optuna.Trial) -> TrialRecord:
        """Returns the record of a trial, finished or running.

        Args:
            trial: an Optuna trial (`FrozenTrial`, or the `Trial` an objective gets).

        Returns:
            The `TrialRecord` its `user_attrs` hold.

        Example:

        ```python
        records = [TrialRecord.from_trial(trial) for trial in study.trials]
        ```
        """
        return cls.from_user_attrs(trial.user_attrs)

    def to_user_attrs(self, *, with_none: Iterable[str] = ()) -> dict[str, Any]:
        """Returns `{user attr key: JSON value}` of the fields that are set.

        Args:
            with_none: fields written even when `None` (a metric that was not finite).

        Returns:
            The attrs to pass to `study.enqueue_trial(user_attrs=...)` or to write on a
            trial; tuples become lists, as the storage returns them.

        Raises:
            ValueError: `with_none` names a field `TrialRecord` does not have.

        Example:

        ```python
        TrialRecord(warm_start="float32", train_steps=4).to_user_attrs()
        # {"train_steps": 4, "warm_start": "float32"}
        ```
        """
        keep = set(with_none)
        unknown = keep - set(_FIELDS_BY_KEY.values())
        if unknown:
            raise ValueError(f"TrialRecord has no field {sorted(unknown)[0]!r}.")
        attrs = {}
        for key, field in _FIELDS_BY_KEY.items():
            value = getattr(self, field)
            if (value is None and field not in keep) or value is False or value == ():
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


def write_record(
    trial: optuna.Trial, record: TrialRecord, *, with_none: Iterable[str] = ()
) -> None:
    """Sets the fields a record holds as the running trial's user attrs (the others stay)."""
    for key, value in record.to_user_attrs(with_none=with_none).items():
        trial.set_user_attr(key, value)


@dataclasses.dataclass(frozen=True)
class TrainedOutcome:
    """What training one assignment found, reused by every trial of the same assignment."""

    metrics: Mapping[str, float]
    proxy: Mapping[str, Any] | None
    proxy_score: float | None
    trial: int | str


def stored_outcome(trial: optuna.trial.FrozenTrial) -> TrainedOutcome | None:
    """Returns what a completed trial trained, or `None` when it trained nothing itself."""
    record = TrialRecord.from_trial(trial)
    if not record.trained_here:
        return None
    metrics = {
        name: (math.nan if value is None else float(value))
        for name, value in record.metrics.items()
    }
    return TrainedOutcome(metrics, record.proxy, record.proxy_score, trial.number)


def assignment_key(assignment: Mapping[str, str]) -> str:
    """Returns a short stable digest of a per-layer assignment (equal assignments, equal keys)."""
    text = json.dumps(sorted(assignment.items()), separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def json_safe(value: Any) -> Any:
    """Returns `value`, or `None` for a float that is not finite (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


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
    for dtype in (BFLOAT16, FLOAT16, FLOAT8):
        if label == keras_label(dtype):
            return dtype
    return None


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
