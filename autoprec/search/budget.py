"""`Budget`: how much worse than float32 a plan's validation metric may be."""

from __future__ import annotations

import dataclasses
import math
import re

from ..errors import AutoprecError

#: Metric-name words (and joined phrases) of metrics that are better when lower.
LOWER_IS_BETTER: frozenset[str] = frozenset(
    {
        "loss",
        "error",
        "mae",
        "mse",
        "rmse",
        "mape",
        "msle",
        "perplexity",
        "crossentropy",
        "hinge",
        "kl",
        "kld",
        "divergence",
        "kullback_leibler",
        "log_cosh",
        "logcosh",
        "poisson",
        "huber",
        "false_positives",
        "false_negatives",
        "wer",
        "cer",
    }
)

#: Metric-name words (and joined phrases) of metrics that are better when higher.
HIGHER_IS_BETTER: frozenset[str] = frozenset(
    {
        "accuracy",
        "acc",
        "auc",
        "precision",
        "recall",
        "f1",
        "fbeta",
        "iou",
        "top_k",
        "r2",
        "sensitivity",
        "specificity",
        "true_positives",
        "true_negatives",
        "cosine_similarity",
        "correlation",
        "bleu",
        "rouge",
        "psnr",
        "ssim",
        "dice",
    }
)

_MODES = ("min", "max", "auto")

#: The violation of a plan whose metric is missing or not finite.
HUGE_VIOLATION = 1e30


@dataclasses.dataclass(frozen=True, init=False)
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
        mode: `"min"` (lower is better, like a loss) or `"max"` (higher is
            better, like accuracy), as in `keras.callbacks.ModelCheckpoint`.
            `"auto"` (the default) reads it from the metric's name (`LOWER_IS_BETTER`,
            `HIGHER_IS_BETTER`) and refuses a name it does not know.

    Raises:
        AutoprecError: when neither limit is given, a limit is negative, `mode`
            is not one of `"min"`, `"max"`, `"auto"`, or `"auto"` meets a metric
            name it cannot read (pass `mode="min"` or `"max"`).

    Example:

    ```python
    budget = autoprec.Budget("val_accuracy", max_drop=0.005)
    budget.threshold(0.91)  # 0.905
    budget.worse_by(0.91, 0.90)  # 0.01
    autoprec.Budget("val_score", max_drop=1.0, mode="max").mode  # "max"
    ```
    """

    metric: str
    max_drop: float | None
    max_relative_drop: float | None
    mode: str

    def __init__(
        self,
        metric: str,
        max_drop: float | None = None,
        max_relative_drop: float | None = None,
        mode: str = "auto",
    ) -> None:
        if not isinstance(metric, str) or not metric:
            raise AutoprecError(f"Budget: metric must be a metric name, got {metric!r}.")
        if max_drop is None and max_relative_drop is None:
            raise AutoprecError(
                f"Budget({metric!r}): give max_drop (absolute, e.g. 0.005) and/or "
                "max_relative_drop (fraction of the reference, e.g. 0.01)."
            )
        for name, value in (("max_drop", max_drop), ("max_relative_drop", max_relative_drop)):
            if value is not None and (not math.isfinite(value) or value < 0):
                raise AutoprecError(f"Budget: {name} must be a non-negative number, got {value}.")
        if mode not in _MODES:
            raise AutoprecError(
                f"Budget({metric!r}): mode must be 'min' (lower is better), 'max' (higher is "
                f"better) or 'auto' (read from the name), got {mode!r}."
            )
        if mode == "auto":
            mode = infer_mode(metric)
        object.__setattr__(self, "metric", metric)
        object.__setattr__(self, "max_drop", max_drop)
        object.__setattr__(self, "max_relative_drop", max_relative_drop)
        object.__setattr__(self, "mode", mode)

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
        sign = -1.0 if self.mode == "max" else 1.0
        return reference + sign * self.allowance(reference)

    def worse_by(self, reference: float, value: float) -> float:
        """Returns how much worse than `reference` `value` is (< 0: better), in the metric's units."""
        return float(reference - value if self.mode == "max" else value - reference)

    def violation(self, reference: float, value: float | None) -> float:
        """Returns by how much `value` misses the budget: > 0 violated, <= 0 within budget."""
        if value is None or not math.isfinite(value):
            return HUGE_VIOLATION
        return float(self.worse_by(reference, value) - self.allowance(reference))

    def to_dict(self) -> dict[str, str | float | None]:
        """Returns the budget as a JSON-ready dict: `metric`, `max_drop`, `max_relative_drop`, `mode`."""
        return dataclasses.asdict(self)


def infer_mode(metric: str) -> str:
    """Returns `"min"` or `"max"`: whether a lower or a higher value of `metric` is better."""
    name = metric.lower()
    name = name[4:] if name.startswith("val_") else name
    name = re.sub(r"_\d+$", "", name)
    words = [word for word in re.split(r"[^a-z0-9]+", name) if word]
    phrases = {
        "_".join(words[start:end])
        for start in range(len(words))
        for end in range(start + 1, len(words) + 1)
    }
    lower = sorted(phrases & LOWER_IS_BETTER)
    higher = sorted(phrases & HIGHER_IS_BETTER)
    if lower and not higher:
        return "min"
    if higher and not lower:
        return "max"
    why = (
        f"its name has both {lower[0]!r} (lower is better) and {higher[0]!r} (higher is better)"
        if lower
        else "its name is not one autoprec knows"
    )
    raise AutoprecError(
        f"Budget({metric!r}): cannot tell whether a lower or a higher {metric!r} is better: "
        f"{why}. Pass mode='min' (lower is better, like a loss) or mode='max' (higher is "
        "better, like accuracy), as keras.callbacks.ModelCheckpoint takes it."
    )
