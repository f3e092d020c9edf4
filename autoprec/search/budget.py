"""`Budget`, how much worse than float32 a plan may be, and the output rounding floor its 16-bit outputs put on it."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import keras
import ml_dtypes
import numpy as np

from .._core.dtypes import BFLOAT16, FLOAT16
from ..errors import AutoprecError

#: Metric-name words (and joined phrases) of metrics that are better when lower.
LOWER_IS_BETTER: frozenset[str] = frozenset(
    "loss error mae mse rmse mape msle perplexity crossentropy hinge kl kld divergence "
    "kullback_leibler log_cosh logcosh poisson huber false_positives false_negatives wer cer".split()
)

#: Metric-name words (and joined phrases) of metrics that are better when higher.
HIGHER_IS_BETTER: frozenset[str] = frozenset(
    "accuracy acc auc precision recall f1 fbeta iou top_k r2 sensitivity specificity "
    "true_positives true_negatives cosine_similarity correlation bleu rouge psnr ssim dice".split()
)

_MODES = ("min", "max", "auto")

#: The violation of a plan whose metric is missing or not finite.
HUGE_VIOLATION = 1e30


@dataclasses.dataclass(frozen=True)
class Budget:
    """How much worse than float32 a plan's validation metric may be.

    The reference is the float32 model trained and evaluated exactly like each
    candidate: same initial weights, same batches in the same order, same steps.

    Args:
        metric: a validation metric the compiled model reports (`val_` prefix optional).
        max_drop: largest allowed worsening, in the metric's units.
        max_relative_drop: largest allowed worsening as a fraction of |reference|.
        mode: `"min"`, `"max"` or `"auto"` (read from the metric's name).

    Raises:
        AutoprecError: no limit, a negative limit, a bad `mode`, or a name `"auto"` cannot read.

    Example:

    ```python
    budget = autoprec.Budget("val_accuracy", max_drop=0.005)
    budget.threshold(0.91)  # 0.905
    budget.worse_by(0.91, 0.90)  # 0.01
    autoprec.Budget("val_score", max_drop=1.0, mode="max").mode  # "max"
    ```
    """

    metric: str
    max_drop: float | None = None
    max_relative_drop: float | None = None
    mode: str = "auto"

    def __post_init__(self) -> None:
        metric, max_drop, max_relative_drop, mode = dataclasses.astuple(self)
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
            object.__setattr__(self, "mode", infer_mode(metric))

    @property
    def log_name(self) -> str:
        """The key of the metric in `evaluate(return_dict=True)`: the name without `val_`."""
        return self.metric[4:] if self.metric.startswith("val_") else self.metric

    def allowance(self, reference: float) -> float:
        """Returns how much worse than `reference` a plan may be (the tighter of both limits)."""
        relative = self.max_relative_drop
        relative = None if relative is None else relative * abs(reference)
        return min(limit for limit in (self.max_drop, relative) if limit is not None)

    def threshold(self, reference: float) -> float:
        """Returns the worst metric value still within budget."""
        return reference + (-1.0 if self.mode == "max" else 1.0) * self.allowance(reference)

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


#: Words in a loss's name that make it a classification loss (outputs may round to 16 bits).
CLASSIFICATION_LOSS_WORDS = ("crossentropy", "hinge")


def loss_names(model: keras.Model) -> list[str]:
    """Returns the names of the losses `model` is compiled with, one per output that has one."""

    def name_of(loss: Any) -> str:
        if isinstance(loss, str):
            return loss
        name = getattr(loss, "name", None) or type(loss).__name__
        if type(loss).__name__ in ("function", "LossFunctionWrapper"):
            name = getattr(loss, "__name__", None) or getattr(loss, "name", "")
        return str(name)

    losses = keras.tree.flatten(getattr(model, "loss", None))
    return [name_of(loss) for loss in losses if loss is not None]


def has_classification_loss(model: keras.Model) -> bool:
    """Returns whether every loss `model` is compiled with is a classification loss."""
    names = loss_names(model)
    return bool(names) and all(
        any(word in name.lower().replace("_", "") for word in CLASSIFICATION_LOSS_WORDS)
        for name in names
    )


def rounding_floor_outputs(model: keras.Model, outputs: Iterable[str]) -> dict[str, str]:
    """Returns `{path: reason}` for the output layers whose 16-bit rounding would floor the loss."""
    names = loss_names(model)
    if not names or has_classification_loss(model):
        return {}
    words = "/".join(sorted(set(names)))
    reason = (
        f"the loss '{words}' reads the predictions themselves; rounded to 16 bits "
        "they carry a relative error floor of 2^-9 (bfloat16) or 2^-12 (float16) that "
        "training cannot remove"
    )
    return dict.fromkeys(sorted(outputs), reason)


#: The output dtypes that round a model's outputs enough to leave a floor.
SIXTEEN_BIT: tuple[str, ...] = (BFLOAT16, FLOAT16)
#: Largest share of the budget's allowance a floor may take (the rest is for the plan's training).
FLOOR_FRACTION = 0.5
#: How many times closer to zero the float32 reference may get once trained to convergence.
CONVERGENCE_HEADROOM = 10.0
#: The rule a floor is judged by, as the metadata records it.
FLOOR_RULE = {"fraction": FLOOR_FRACTION, "headroom": CONVERGENCE_HEADROOM}
#: Where the unrounded outputs come from: the targets, or the float32 reference's outputs.
TARGETS, FLOAT32_OUTPUTS = "targets", "float32 outputs"

_NUMPY_DTYPES = {BFLOAT16: np.dtype(ml_dtypes.bfloat16), FLOAT16: np.dtype(np.float16)}


def round_to(values: Any, dtype: str) -> np.ndarray:
    """Returns `values` rounded to `dtype` and back to float32 (nearest, ties to even)."""
    array = np.asarray(values, dtype=np.float32)
    with np.errstate(over="ignore"):
        return array.astype(_NUMPY_DTYPES[dtype]).astype(np.float32)


def converged_outputs(
    targets: Any,
    output_shapes: Sequence[tuple[int | None, ...] | None],
    float32_outputs: Callable[[], Any],
) -> tuple[list[np.ndarray], tuple[str, ...]]:
    """Returns the outputs a converged model would give, one per model output, and their sources."""
    count = len(output_shapes)
    flat_targets = keras.tree.flatten(targets)
    if len(flat_targets) != count:
        flat_targets = [None] * count
    predicted: list[np.ndarray] = []
    outputs, sources = [], []
    for index, (target, shape) in enumerate(zip(flat_targets, output_shapes)):
        array = None if target is None else np.asarray(target)
        known = shape is not None and all(isinstance(d, int) for d in shape)
        if (
            array is not None
            and known
            and np.issubdtype(array.dtype, np.floating)
            and array.size == len(array) * math.prod(shape)
        ):
            outputs.append(array.astype(np.float32).reshape((len(array), *shape)))
            sources.append(TARGETS)
            continue
        if not predicted:
            predicted = [np.asarray(a, np.float32) for a in keras.tree.flatten(float32_outputs())]
            if len(predicted) != count:
                raise ValueError(
                    f"the model gave {len(predicted)} validation output(s) for {count} "
                    "output layer(s); the output floor cannot pair them."
                )
        outputs.append(predicted[index])
        sources.append(FLOAT32_OUTPUTS)
    return outputs, tuple(sources)


def measure_floor(
    metric_of: Callable[[list[np.ndarray]], Mapping[str, float]],
    outputs: Sequence[np.ndarray],
    rounded: Mapping[int, str],
    budget: Budget,
) -> float:
    """Returns the floor that rounding some outputs puts on a metric (>= 0; inf out of range)."""
    up, down = list(outputs), list(outputs)
    for index, dtype in rounded.items():
        error = round_to(outputs[index], dtype) - outputs[index]
        if not np.isfinite(error).all():
            return math.inf
        up[index] = outputs[index] + error
        down[index] = outputs[index] - error
    name = budget.log_name
    base = float(metric_of(list(outputs))[name])
    mean = 0.5 * (float(metric_of(up)[name]) + float(metric_of(down)[name]))
    if not math.isfinite(mean):
        return math.inf
    return max(0.0, budget.worse_by(base, mean))


@dataclasses.dataclass(frozen=True)
class OutputFloor:
    """The floor a plan's 16-bit outputs put on the budget metric, and whether it is refused: when
    it takes more than `FLOOR_FRACTION` of the allowance at a converged reference."""

    budget: Budget
    reference: float
    dtypes: Mapping[str, str]
    floors: Mapping[str, float]
    sources: Mapping[str, str]
    value: float

    @property
    def converged_reference(self) -> float:
        """The float32 metric the allowance is measured against once converged."""
        if self.budget.mode == "max" and self.reference >= 0:
            return float(self.reference)
        return float(self.reference) / CONVERGENCE_HEADROOM

    @property
    def limit(self) -> float:
        """The largest floor a plan may have, in the metric's units."""
        return FLOOR_FRACTION * self.budget.allowance(self.converged_reference)

    @property
    def break_even(self) -> float | None:
        """|Converged float32 metric| below which the floor is refused (inf always, None never)."""
        budget, share = self.budget, FLOOR_FRACTION
        if budget.max_drop is not None and self.value >= share * budget.max_drop:
            return math.inf
        if budget.max_relative_drop is None:
            return None
        if budget.max_relative_drop == 0:
            return math.inf
        return self.value / (share * budget.max_relative_drop)

    @property
    def violation(self) -> float:
        """By how much the floor exceeds the limit: > 0 refused."""
        return self.value - self.limit if math.isfinite(self.value) else HUGE_VIOLATION

    @property
    def refused(self) -> bool:
        """Whether the floor breaks the budget once trained to convergence."""
        return self.violation > 0

    @property
    def reason(self) -> str:
        """One line: which outputs, what floor, against which limit, and the verdict."""
        outputs = ", ".join(
            f"{dtype} {path!r} ({_floor_text(self.floors.get(path, math.nan))}, "
            f"{self.sources.get(path, TARGETS)} rounded)"
            for path, dtype in self.dtypes.items()
        )
        if self.converged_reference == self.reference:
            against = f"float32 at the {self.reference:.4g} seen"
        else:
            against = (
                f"float32 once converged, assumed at {self.converged_reference:.4g}: "
                f"{CONVERGENCE_HEADROOM:g}x closer to zero than the {self.reference:.4g} seen"
            )
        verdict = "more than" if self.refused else "within"
        return (
            f"the outputs of {outputs} put a floor of {_floor_text(self.value)} on "
            f"{self.budget.metric} that no training removes, {verdict} the limit "
            f"{self.limit:.3g} ({FLOOR_FRACTION:g} of the budget's allowance against {against})"
        )

    def to_dict(self) -> dict[str, Any]:
        """Returns the floor as a JSON-ready dict (inf as `None`), with `refused` and `reason`."""
        return {
            "metric": self.budget.metric,
            "dtypes": dict(self.dtypes),
            "floors": {path: json_safe(value) for path, value in self.floors.items()},
            "sources": dict(self.sources),
            "value": json_safe(self.value),
            "reference": float(self.reference),
            "converged_reference": self.converged_reference,
            "limit": self.limit,
            "break_even": json_safe(self.break_even),
            "rule": dict(FLOOR_RULE),
            "refused": self.refused,
            "reason": self.reason,
        }


def _floor_text(value: float) -> str:
    return "beyond the dtype's range" if math.isinf(value) else f"{value:.3g}"


def json_safe(value: Any) -> Any:
    """Returns `value`, or `None` for a float that is not finite (JSON has no NaN)."""
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value
