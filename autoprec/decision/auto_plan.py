"""`AutoPlan`: the settings of `AutoPrecision()`'s automatic mode, checked when they are made."""

from __future__ import annotations

import dataclasses
from typing import Any

from .._core.models import ConfigValue
from ..errors import PlanError
from ..search import Budget

#: The share of the whole fit the decision may take by default (`AutoPlan.decision_seconds`).
DECISION_SHARE = 0.1

#: The most of the first epoch the decision may take by default, however long the fit.
FIRST_EPOCH_SHARE = 0.2

#: The most seconds the decision may take by default, however long the fit.
DECISION_CAP_SECONDS = 60.0


def decision_budget(auto: AutoPlan, epoch_seconds: float | None, epochs: int | None = 1) -> float:
    """Returns the seconds the decision may take: `auto.decision_seconds`, else the default."""
    if auto.decision_seconds is not None:
        return float(auto.decision_seconds)
    if epoch_seconds is None:
        return DECISION_CAP_SECONDS
    share = min(DECISION_SHARE * max(int(epochs or 1), 1), FIRST_EPOCH_SHARE)
    return min(DECISION_CAP_SECONDS, share * float(epoch_seconds))


@dataclasses.dataclass(frozen=True)
class AutoPlan(ConfigValue):
    """Settings of `AutoPrecision()`'s automatic mode: how it profiles, times and decides a plan.

    With no plan, `AutoPrecision` profiles the first `profile_steps` steps of
    `fit` in the model's own policies, times every layer at the batch size `fit`
    uses (read from the first batch) and builds the heuristic plan; with a
    `budget` it runs a short Optuna search of `n_trials` trials on `x` and
    `validation_data` instead (a callback cannot see `fit`'s data, so the
    search needs its own). `get_config()` and `AutoPlan.from_config(config)`
    round-trip it through a plain dict (the data and budget included as they are).

    Attributes:
        profile_steps: steps profiled before deciding.
        batch_size: the batch size layer costs are timed or predicted for;
            `None` reads it from `fit`'s first batch (per replica).
        budget: an `autoprec.Budget`: search under it instead of the heuristic.
        x: training batches for the search: an `(x, y)` tuple of arrays, a
            `tf.data.Dataset`, a `PyDataset` or a generator of batches.
        validation_data: held-out batches the search judges candidate plans on.
        n_trials: trials of that search.
        timing_rounds: where costs are measured here (`hardware="local"`) and no
            budget is given, the heuristic plan is not kept on its prediction: the
            next steps of `fit` run float32, each uniform 16-bit policy the device
            runs fast and the profile allows (as Keras' global `mixed_*` policy sets
            it: every layer) and the per-layer plan in turn, each traced once, then
            in `timing_rounds` interleaved rounds of 2 timed steps each (more rounds,
            up to 9, while the verdict is undecided; all inside the first epoch,
            judged on the rounds timed when it ends); the fastest whole step is
            kept, a difference inside the measured noise going to the simpler plan
            (`plan.metadata["measured"]` records what was timed). These steps train
            the model as usual. 0 keeps the predicted plan without timing.
        decision_seconds: the most seconds the decision may add to `fit` where
            costs are measured here: per-layer timing stops when they run out (the
            layers left get predicted costs), and the whole steps raced inside `fit`
            decide. `None`: `DECISION_SHARE` of the whole fit, at most
            `FIRST_EPOCH_SHARE` of the first epoch (estimated from the profiled
            steps) and `DECISION_CAP_SECONDS` (`decision_budget`). The report says
            what the decision took (`plan.metadata["measured"]`).

    Raises:
        PlanError: for a `budget` without `x` and `validation_data` (or data
            without a budget), a `budget` that is not an `autoprec.Budget`, or a
            count below 1.

    Example:

    ```python
    auto = autoprec.AutoPlan(
        budget=autoprec.Budget("val_accuracy", max_drop=0.01),
        x=(x_train, y_train), validation_data=(x_val, y_val), n_trials=10,
    )
    model.fit(x_train, y_train, callbacks=[autoprec.AutoPrecision(auto=auto)])
    ```
    """

    profile_steps: int = 20
    batch_size: int | None = None
    budget: Budget | None = None
    x: Any = dataclasses.field(default=None, compare=False)
    validation_data: Any = dataclasses.field(default=None, compare=False)
    n_trials: int = 20
    timing_rounds: int = 5
    decision_seconds: float | None = None

    def __post_init__(self) -> None:
        for name in ("profile_steps", "n_trials"):
            _require_count(name, getattr(self, name))
        if self.timing_rounds != 0:
            _require_count("timing_rounds", self.timing_rounds, "or 0 (no timing)")
        if self.decision_seconds is not None and (
            isinstance(self.decision_seconds, bool)
            or not isinstance(self.decision_seconds, (int, float))
            or not self.decision_seconds >= 0
        ):
            raise PlanError(
                f"AutoPlan: decision_seconds must be a number of seconds >= 0 or None (a share "
                f"of the first epoch), got {self.decision_seconds!r}."
            )
        if self.batch_size is not None:
            _require_count("batch_size", self.batch_size, "or None (the batch size fit uses)")
        if self.budget is not None and not isinstance(self.budget, Budget):
            raise PlanError(
                f"AutoPlan: budget must be an autoprec.Budget or None, got {self.budget!r}; "
                'e.g. budget=autoprec.Budget("val_loss", max_relative_drop=0.02).'
            )
        has_data = self.x is not None and self.validation_data is not None
        if self.budget is not None and not has_data:
            raise PlanError(
                "AutoPlan: budget= runs a search, which needs x= (training batches) and "
                "validation_data= (held-out batches to judge candidate plans on); a callback "
                "cannot see fit's data. Pass both, or leave budget=None for the heuristic plan."
            )
        if self.budget is None and (self.x is not None or self.validation_data is not None):
            raise PlanError(
                "AutoPlan: x= and validation_data= are the search's data; pass budget= "
                "(an autoprec.Budget) to search, or leave them out for the heuristic plan."
            )

    def __repr__(self) -> str:
        data = ""
        if self.budget is not None:
            data = f", x={_describe_data(self.x)}, validation_data={_describe_data(self.validation_data)}"
        return (
            f"AutoPlan(profile_steps={self.profile_steps}, batch_size={self.batch_size}, "
            f"budget={self.budget!r}{data}, n_trials={self.n_trials}, "
            f"timing_rounds={self.timing_rounds}, decision_seconds={self.decision_seconds})"
        )


def _require_count(name: str, value: object, otherwise: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        accepted = f"an integer >= 1 {otherwise}".strip()
        raise PlanError(f"AutoPlan: {name} must be {accepted}, got {value!r}.")


def _describe_data(data: Any) -> str:
    """Returns a short description of a data argument (shapes, not values) for reprs."""
    if isinstance(data, (tuple, list)):
        return "(" + ", ".join(_describe_data(item) for item in data) + ")"
    shape = getattr(data, "shape", None)
    if shape is not None:
        return f"{type(data).__name__}{tuple(shape)}"
    return f"<{type(data).__name__}>"
