"""`Budget`: how much worse than float32 a plan's validation metric may be."""

from __future__ import annotations

import dataclasses
import math

from ..errors import AutoprecError

#: Metric-name fragments whose metrics are better when lower.
_LOWER_IS_BETTER = ("loss", "error", "mse", "mae", "mape", "msle", "crossentropy", "hinge")

#: The violation of a plan whose metric is missing or not finite.
_HUGE_VIOLATION = 1e30


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

    def violation(self, reference: float, value: float | None) -> float:
        """Returns by how much `value` misses the budget: > 0 violated, <= 0 within budget."""
        if value is None or not math.isfinite(value):
            return _HUGE_VIOLATION
        worse_by = reference - value if self.direction == "higher" else value - reference
        return float(worse_by - self.allowance(reference))

    def to_dict(self) -> dict[str, str | float | None]:
        """Returns the budget as a JSON-ready dict."""
        return dataclasses.asdict(self)


def _infer_direction(metric: str) -> str:
    name = metric.lower()
    return "lower" if any(token in name for token in _LOWER_IS_BETTER) else "higher"
