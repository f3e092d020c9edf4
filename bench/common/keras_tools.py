"""Keras helpers of the benchmarks: workloads, builds under a global policy, fresh copies,
train steps, the search they run, autoprec's shown lines captured, plans summarised.

Any Keras backend; no TensorFlow, no Optuna imported here.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import keras
import numpy as np

import autoprec


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark model: how to build it, its data, batch size and loss.

    Attributes:
        name: the `--models` name.
        kind: a few words on what it is.
        build: builds the uncompiled model (the global dtype policy applies to it).
        data: `data(seed, samples)` returns `(x, y)` NumPy arrays (x may be a dict).
        batch_size: the batch size it trains, is timed and is measured with.
        logits: whether the model outputs logits (else probabilities); `None` for
            a regression (mean squared error).
        search_baseline: the search's `SearchSettings.baseline`; `None` for models with
            BatchNormalization, whose moving statistics do not settle in a few training
            steps, so their validation loss (inference mode) is no better than the
            untrained model's at the search's fidelity although they learn.
    """

    name: str
    kind: str
    build: Callable[[], keras.Model]
    data: Callable[[int, int], tuple[Any, np.ndarray]]
    batch_size: int
    logits: bool | None = False
    search_baseline: str | None = "auto"

    def loss(self) -> keras.losses.Loss:
        """A fresh instance of the workload's loss."""
        if self.logits is None:
            return keras.losses.MeanSquaredError()
        return keras.losses.SparseCategoricalCrossentropy(from_logits=self.logits)

    def compile(self, model: keras.Model, loss_scale: bool = False) -> None:
        """Compiles `model` with Adam (1e-3) and the workload's loss (`compile_adam`)."""
        compile_adam(model, self.loss(), loss_scale=loss_scale)


def compile_adam(
    model: keras.Model, loss: Any, learning_rate: float = 1e-3, loss_scale: bool = False
) -> None:
    """Compiles with Adam; `loss_scale` wraps it in Keras' `LossScaleOptimizer`, as Keras does."""
    optimizer = keras.optimizers.Adam(learning_rate)
    if loss_scale:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss=loss)


def search_val_loss(
    model: keras.Model,
    train: tuple,
    validation: tuple,
    *,
    hardware: str,
    trials: int,
    batch_size: int,
    steps_per_trial: int,
    baseline: str | None,
    timeout: float | None = None,
    confirm_steps: int | None = None,
) -> autoprec.SearchResult:
    """`autoprec.search` within `Budget("val_loss", max_relative_drop=0.05)`, seed 0, silent."""
    return autoprec.search(
        model,
        train,
        validation_data=validation,
        budget=autoprec.Budget("val_loss", max_relative_drop=0.05),
        hardware=hardware,
        n_trials=trials,
        timeout=timeout,
        verbose=0,
        settings=autoprec.SearchSettings(
            batch_size=batch_size,
            steps_per_trial=steps_per_trial,
            seed=0,
            baseline=baseline,
            confirm_steps=confirm_steps,
        ),
    )


@contextlib.contextmanager
def global_policy(name: str) -> Iterator[None]:
    """Builds under Keras' global dtype policy `name`; the previous policy comes back after."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def fresh_copy(
    build: Callable[[], keras.Model],
    weights: list | None = None,
    policy: str = "float32",
    compile_with: Callable[[keras.Model], None] | None = None,
) -> keras.Model:
    """`build()` under Keras' global `policy` from seed 0, with `weights` if given.

    `compile_with(model)` compiles it, under that policy too (under `mixed_float16`
    Keras wraps the optimizer in its `LossScaleOptimizer`).
    """
    with global_policy(policy):
        keras.utils.set_random_seed(0)
        model = build()
        if weights is not None:
            model.set_weights(weights)
        if compile_with is not None:
            compile_with(model)
    return model


def train_step(model: keras.Model, x: Any, y: Any) -> Callable[[], float]:
    """One `train_on_batch` on the fixed batch, synchronised by reading the loss (returned)."""

    def step() -> float:
        logs = model.train_on_batch(x, y, return_dict=True)
        return float(logs["loss"])

    return step


def weights_finite(model: keras.Model) -> bool:
    """Whether every weight of `model` is finite."""
    return all(np.isfinite(weight).all() for weight in model.get_weights())


class MessageCapture(logging.Handler):
    """Keeps the lines autoprec shows (its `"autoprec"` logger) while installed."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def captured_messages(keras_logging_off: bool = True) -> Iterator[MessageCapture]:
    """Routes autoprec's shown lines to a `MessageCapture`, not to any root handler as well.

    `keras_logging_off`: Keras' interactive logging off meanwhile (no progress bars).
    """
    logger = logging.getLogger("autoprec")
    handler, level, propagate = MessageCapture(), logger.level, logger.propagate
    interactive = keras_logging_off and keras.config.is_interactive_logging_enabled()
    if keras_logging_off:
        keras.config.disable_interactive_logging()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
        if interactive:
            keras.config.enable_interactive_logging()


def composition(plan: Any) -> dict[str, int]:
    """Layers of a plan per compute dtype (only the dtypes it uses)."""
    return dict(sorted(collections.Counter(plan.layers.values()).items()))


def plan_report(
    metadata: dict[str, Any], words: Iterable[str], search_keys: Iterable[str] = ()
) -> dict[str, Any]:
    """The figures a plan records about what was measured, predicted and chosen (read defensively).

    Every top-level key of `metadata` holding one of `words`, and the same keys of
    `metadata["search"]` with the `search_keys` besides; per-layer evidence is
    summarised (`evidence_summary`; its full text stays in the plan).
    """
    words, search_keys = tuple(words), set(search_keys)
    report: dict[str, Any] = {}
    sources = [("", metadata)]
    if isinstance(metadata.get("search"), dict):
        sources.append(("search.", metadata["search"]))
    for prefix, source in sources:
        for key, value in source.items():
            key = str(key)
            wanted = any(word in key.lower() for word in words)
            if not (wanted or (prefix and key in search_keys)) or value is None:
                continue
            if key == "evidence" and isinstance(value, dict):
                value = evidence_summary(value)
            report[prefix + key] = value
    return report


def evidence_summary(evidence: dict[str, Any]) -> dict[str, Any]:
    """Per-layer evidence in a few figures: layers per reason, per allowed dtypes, summed seconds."""
    entries = [entry for entry in evidence.values() if isinstance(entry, dict)]
    summary: dict[str, Any] = {"layers": len(evidence)}
    reasons = collections.Counter(str(entry["reason"]) for entry in entries if "reason" in entry)
    if reasons:
        summary["per_reason"] = dict(reasons.most_common())
    allowed = collections.Counter(
        "/".join(entry["allowed"]) for entry in entries if isinstance(entry.get("allowed"), list)
    )
    if allowed:
        summary["per_allowed"] = dict(allowed.most_common())
    seconds: dict[str, float] = collections.defaultdict(float)
    for entry in entries:
        for dtype, value in (entry.get("seconds") or {}).items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                seconds[dtype] += value
    if seconds:
        summary["summed_layer_ms"] = {
            dtype: round(value * 1e3, 3) for dtype, value in seconds.items()
        }
    return summary
