"""How long the search trains: a reference that must beat a trivial baseline, and the confirmation."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from typing import Any

import keras

from .._core.data import take_batches
from .._core.dtypes import FLOAT32
from ..errors import AutoprecError
from ..plan import PrecisionPlan
from .budget import Budget
from .evaluator import Evaluator

logger = logging.getLogger("autoprec")

#: Below this many train steps the search's fidelity is low: its choice is confirmed longer.
LOW_FIDELITY_STEPS = 64
#: Without a measured spread, a margin under this fraction of the allowance is a close decision.
_CLOSE_FRACTION = 0.5


@dataclasses.dataclass(frozen=True)
class FidelityCheck:
    """Whether the float32 reference learned enough at the search's fidelity for the budget."""

    train_steps: int
    requested_steps: int
    reference: float
    baseline: float | None
    baseline_kind: str
    status: str

    def to_dict(self) -> dict[str, Any]:
        """Returns the check as a JSON-ready dict."""
        return dataclasses.asdict(self)


def trivial_baseline(
    evaluator: Evaluator, budget: Budget, untrained: dict[str, float] | None = None
) -> tuple[float, str]:
    """Returns `(value, kind)`: what a model that learned nothing scores on the budget metric."""
    name = budget.log_name.lower()
    outputs = getattr(evaluator.model, "outputs", None) or []
    if budget.mode == "max" and len(outputs) == 1 and "top_k" not in name:
        if "auc" in name:
            return 0.5, "chance (AUC 0.5)"
        if "acc" in name:
            width = outputs[0].shape[-1]
            classes = 2 if width in (None, 1) else int(width)
            return 1.0 / classes, f"chance (1/{classes} classes)"
    metrics = untrained if untrained is not None else evaluator.untrained_metrics()
    return float(metrics[budget.log_name]), "untrained"


def _noise_margin(budget: Budget, baseline: float, kind: str, samples: int) -> float:
    """How much better than the baseline a reference must be to count as having learned."""
    if kind.startswith("chance") and 0.0 < baseline < 1.0:
        return math.sqrt(baseline * (1.0 - baseline) / max(samples, 1))
    return 0.01 * abs(baseline)


def longer_batches(
    train_data: Any, batch_size: int, steps: int, current: list[tuple]
) -> list[tuple]:
    """Returns `steps` training batches: fresh ones where the data has them, else repeated in order."""
    taken = list(current)
    if not hasattr(train_data, "__next__"):
        taken = take_batches(train_data, batch_size, steps, what="search: train_data")
    return list(itertools.islice(itertools.cycle(taken), steps))


def check_reference(
    evaluator: Evaluator,
    budget: Budget,
    train_data: Any,
    batch_size: int,
    max_train_steps: int,
    baseline: float | str | None,
) -> tuple[dict[str, float], FidelityCheck]:
    """Trains the float32 reference, lengthening training until it beats the trivial baseline."""
    requested = len(evaluator.train_batches)
    float32_plan = PrecisionPlan.uniform(evaluator.model, FLOAT32)
    metrics = evaluator.train_and_evaluate(float32_plan, keep_outputs=True)
    reference = _finite_reference(metrics, budget, requested)
    if baseline is None:
        return metrics, FidelityCheck(requested, requested, reference, None, "off", "off")
    if isinstance(baseline, str):
        if baseline != "auto":
            raise AutoprecError(
                f"search: baseline must be 'auto', a number or None, got {baseline!r}."
            )
        value, kind = trivial_baseline(evaluator, budget)
    else:
        value, kind = float(baseline), "given"
    steps = requested
    while budget.violation(reference, value) <= 0 and steps * 2 <= max_train_steps:
        steps *= 2
        logger.info(
            "autoprec.search: the float32 reference's %s %.4g does not beat the trivial baseline "
            "%.4g (%s) by more than the budget allows; training longer: %d steps.",
            budget.metric,
            reference,
            value,
            kind,
            steps,
        )
        evaluator.set_train_batches(
            longer_batches(train_data, batch_size, steps, evaluator.train_batches)
        )
        metrics = evaluator.train_and_evaluate(float32_plan, keep_outputs=True)
        reference = _finite_reference(metrics, budget, steps)
    check = FidelityCheck(steps, requested, reference, value, kind, "meaningful")
    if budget.violation(reference, value) > 0:
        return metrics, check
    samples = len(keras.tree.flatten(evaluator.val_y)[0])
    gain = (reference - value) if budget.mode == "max" else (value - reference)
    if gain <= _noise_margin(budget, value, kind, samples):
        raise AutoprecError(
            f"search: the float32 reference's {budget.metric} is {reference:.4g} after {steps} "
            f"train steps, no better than the trivial baseline {value:.4g} ({kind}): it has not "
            "learned at this fidelity, so every plan would hold the budget. Give more "
            "SearchSettings(steps_per_trial=...) (or a larger max_steps_per_trial), more or easier training data, or a "
            "metric the model learns in that many steps; SearchSettings(baseline=None) skips this check "
            "(e.g. for a model that is already trained)."
        )
    message = (
        f"budget on {budget.metric} allows {budget.allowance(reference):.3g}, more than the "
        f"float32 reference ({reference:.4g} after {steps} steps) gains over the trivial "
        f"baseline {value:.4g} ({kind}): a plan no better than the baseline would hold it."
    )
    logger.warning("autoprec.search: %s", message)
    return metrics, dataclasses.replace(check, status="loose budget")


def _finite_reference(metrics: dict[str, float], budget: Budget, steps: int) -> float:
    reference = metrics[budget.log_name]
    if not math.isfinite(reference):
        raise AutoprecError(
            f"search: the float32 reference's {budget.metric} is {reference} after {steps} "
            "train steps; the model does not train stably in float32 with these settings, so "
            "no budget can be checked."
        )
    return reference


def confirmation_reasons(
    budget: Budget, reference: float, violation: float, spread: float | None, train_steps: int
) -> list[str]:
    """Returns why a plan chosen at the search's fidelity needs a longer confirmation (empty: none)."""
    reasons = []
    if train_steps < LOW_FIDELITY_STEPS:
        reasons.append(f"low fidelity ({train_steps} train steps < {LOW_FIDELITY_STEPS})")
    margin = -violation
    if spread is not None and margin <= spread:
        reasons.append(
            f"close decision (margin {margin:.3g} within the reference spread {spread:.3g})"
        )
    elif spread is None and margin < _CLOSE_FRACTION * budget.allowance(reference):
        reasons.append(
            f"close decision (margin {margin:.3g} under half the allowance "
            f"{budget.allowance(reference):.3g}; spread not measured)"
        )
    return reasons
