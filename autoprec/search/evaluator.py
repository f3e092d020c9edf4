"""The search's evaluator: runs one plan on a private copy of the model at a given fidelity, and checks the float32 reference."""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import keras
import numpy as np

from .._core.data import batch_size_of, concatenate_batches, take_batches
from .._core.dtypes import FLOAT32
from .._core.models import compile_arguments, recompile
from .._core.timing import rotated, time_interleaved, time_until_decided
from ..errors import AutoprecError, BackendError
from ..layers import describe_model, layer_paths, layer_policy
from ..plan import PrecisionPlan
from ..runtime import FlooredLossScaleOptimizer, PlanCallback, apply_plan, reset_compiled_functions
from ..runtime.emulation import Float16Emulation, emulated_layers, without_float16
from ..runtime.float8 import (
    keep_nested_float8_policies,
    restore_variables,
    sync_float8_variables,
    weight_variables,
)
from .budget import Budget, json_safe
from .result import simplicity

logger = logging.getLogger("autoprec")

_PROXY_LOSS_SCALE = 2.0**10


@dataclasses.dataclass(frozen=True)
class ProxyResult:
    """Level-2 figures of one plan against float32 from the same weights."""

    loss_relative_error: float
    gradient_cosine: float
    gradient_relative_error: float
    finite: bool

    @property
    def score(self) -> float:
        """One number, lower is better: the larger of the loss and gradient relative errors."""
        if not self.finite:
            return math.inf
        return max(self.loss_relative_error, self.gradient_relative_error)

    def to_dict(self) -> dict[str, float | bool | None]:
        """Returns the figures as a JSON-ready dict (non-finite numbers as `None`)."""
        return {name: json_safe(value) for name, value in dataclasses.asdict(self).items()}


def clone_for_search(model: keras.Model) -> tuple[keras.Model, bool]:
    """Returns `(working_model, is_clone)`: a clone with the same weights, or the model itself."""
    try:
        clone = keras.models.clone_model(model)
        clone.set_weights(model.get_weights())
        return clone, True
    except Exception as error:  # noqa: BLE001 - any model keras cannot rebuild from config
        logger.info(
            "autoprec.search: cannot clone model %r (%s); working on the model itself and "
            "restoring its weights, policies and optimizer afterwards.",
            model.name,
            error,
        )
        return model, False


class Evaluator:
    """Runs plans on a private copy of a compiled model: proxy (level 2), short training (3)."""

    def __init__(
        self,
        model: keras.Model,
        train_batches: list[tuple],
        val_batches: list[tuple],
        proxy_batches: int = 2,
        seed: int = 0,
    ) -> None:
        self.user_model = model
        self.compile_template = compile_arguments(model, what="search")
        self.model, self.is_clone = clone_for_search(model)
        self.user_state = None if self.is_clone else self._snapshot(model)
        self.initial_state = self._snapshot(self.model)
        self.train_batches = train_batches
        self.val_batches = val_batches
        self.train_x, self.train_y = concatenate_batches(train_batches)
        self.val_x, self.val_y = concatenate_batches(val_batches)
        self.batch_size = batch_size_of(train_batches[0][1])
        self.proxy_data = train_batches[: max(1, proxy_batches)]
        self.seed = seed
        self._float32_gradients: list | None = None
        self._emulation: Float16Emulation | None = None
        self._float32_outputs: object | None = None

    def emulate_float16(self) -> bool:
        """Trains and proxies float16 layers emulated from now on (float32 math, float16 rounding)."""
        if not self.is_clone:
            return False
        if self._emulation is None:
            self._emulation = Float16Emulation(self.model)
            self._emulation.install()
        return True

    @property
    def emulates_float16(self) -> bool:
        """Whether float16 layers are emulated in training and in the proxy."""
        return self._emulation is not None

    def _native_plan(self, plan: PrecisionPlan) -> tuple[PrecisionPlan, bool]:
        """Returns `(plan to apply, whether float16 is emulated)`; sets the emulated layers."""
        if self._emulation is None:
            return plan, False
        infos = describe_model(self.model)
        emulated = emulated_layers(plan.resolve(infos))
        self._emulation.set_layers(emulated)
        return (without_float16(plan, infos), True) if emulated else (plan, False)

    @staticmethod
    def _snapshot(model: keras.Model) -> dict[str, list | dict]:
        return {
            "variables": {
                id(variable): (variable, keras.ops.convert_to_numpy(variable))
                for variable in model.variables
            },
            "policies": {path: layer_policy(layer) for path, layer in layer_paths(model).items()},
        }

    def _reset(self) -> None:
        keras.utils.set_random_seed(self.seed)
        restore_variables(self.model, self.initial_state["variables"])

    def close(self) -> None:
        """Puts back the user's model when the evaluator worked on it directly."""
        if self._emulation is not None:
            self._emulation.remove()
            self._emulation = None
        if self.user_state is None:
            return
        paths = layer_paths(self.user_model)
        for path, policy in self.user_state["policies"].items():
            if path in paths:
                paths[path].dtype_policy = policy
        sync_float8_variables(paths.values())
        keep_nested_float8_policies(self.user_model)
        restore_variables(self.user_model, self.user_state["variables"])
        reset_compiled_functions(self.user_model)

    def metric_names(self) -> list[str]:
        """Returns the names `evaluate` reports, checked on one validation batch in float32."""
        return list(self.untrained_metrics(*self.val_batches[0]))

    def set_train_batches(self, train_batches: list[tuple]) -> None:
        """Replaces the batches every training run goes through (a longer or shorter fidelity)."""
        self.train_batches = list(train_batches)
        self.train_x, self.train_y = concatenate_batches(self.train_batches)
        self._float32_outputs = None

    def untrained_metrics(self, x: Any = None, y: Any = None) -> dict[str, float]:
        """Returns the validation metrics (of all, or of `x, y`) of the initial float32 weights."""
        self._reset()
        float32_plan, _ = self._native_plan(PrecisionPlan.uniform(self.model, FLOAT32))
        apply_plan(self.model, float32_plan)
        recompile(self.model, self.compile_template)
        return self._evaluate(self.val_x if x is None else x, self.val_y if y is None else y)

    def _evaluate(self, x: Any, y: Any) -> dict[str, float]:
        logs = self.model.evaluate(x, y, batch_size=self.batch_size, verbose=0, return_dict=True)
        return {name: float(value) for name, value in logs.items()}

    def train_and_evaluate(
        self,
        plan: PrecisionPlan,
        batch_order: list[int] | None = None,
        keep_outputs: bool = False,
    ) -> dict[str, float]:
        """Level 3: trains the plan for the given batches from the initial weights, then evaluates."""
        self._reset()
        plan, emulated = self._native_plan(plan)
        recompile(self.model, self.compile_template)
        if emulated:
            _scale_loss(self.model)
        order = list(range(len(self.train_batches))) if batch_order is None else list(batch_order)
        x, y = self.train_x, self.train_y
        if batch_order is not None:
            x, y = concatenate_batches([self.train_batches[index] for index in order])
        callback = PlanCallback(plan, verbose=0)
        fit = functools.partial(
            self.model.fit,
            batch_size=self.batch_size,
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=[callback],
        )
        fit(x, y)
        skipped = len(order) - int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        if 0 < skipped < len(order):
            logger.debug("autoprec.search: %d skipped step(s) trained again", skipped)
            fit(*concatenate_batches([self.train_batches[index] for index in order[:skipped]]))
        logs = self._evaluate(self.val_x, self.val_y)
        if keep_outputs:
            self._float32_outputs = self.model.predict(
                self.val_x, batch_size=self.batch_size, verbose=0
            )
        return logs

    def float32_outputs(self) -> object:
        """Returns the float32 plan's validation outputs after training on the current batches."""
        if self._float32_outputs is None:
            float32_plan = PrecisionPlan.uniform(self.model, FLOAT32)
            self.train_and_evaluate(float32_plan, keep_outputs=True)
        return self._float32_outputs

    def validation_metrics(self, outputs: object) -> dict[str, float]:
        """Returns the compiled loss and metrics of given outputs on the validation targets."""
        if not getattr(self.model, "compiled", False):
            recompile(self.model, self.compile_template)
        self.model.reset_metrics()
        loss = self.model.compute_loss(x=self.val_x, y=self.val_y, y_pred=outputs, training=False)
        logs = self.model.compute_metrics(self.val_x, self.val_y, outputs)
        values = {name: float(keras.ops.convert_to_numpy(value)) for name, value in logs.items()}
        values["loss"] = float(keras.ops.convert_to_numpy(loss))
        self.model.reset_metrics()
        return values

    def proxy(self, plan: PrecisionPlan) -> ProxyResult:
        """Level 2: loss and gradients of the plan versus float32, same weights, same batches."""
        if self._float32_gradients is None:
            self._float32_gradients = self._losses_and_gradients(
                PrecisionPlan.uniform(self.model, "float32")
            )
        reference = self._float32_gradients
        candidate = self._losses_and_gradients(plan)
        loss_errors, dot, norm_a, norm_b, difference = [], 0.0, 0.0, 0.0, 0.0
        finite = True
        for (loss_ref, grads_ref), (loss, grads) in zip(reference, candidate):
            finite = finite and math.isfinite(loss) and all(np.isfinite(g).all() for g in grads)
            loss_errors.append(abs(loss - loss_ref) / max(abs(loss_ref), 1e-12))
            for g_ref, g in zip(grads_ref, grads):
                dot += float(np.vdot(g_ref, g))
                norm_a += float(np.vdot(g_ref, g_ref))
                norm_b += float(np.vdot(g, g))
                difference += float(np.vdot(g - g_ref, g - g_ref))
        if not finite:
            return ProxyResult(math.inf, -1.0, math.inf, False)
        cosine = dot / math.sqrt(max(norm_a * norm_b, 1e-300))
        relative = math.sqrt(difference / max(norm_a, 1e-300))
        return ProxyResult(float(np.mean(loss_errors)), cosine, relative, True)

    def _losses_and_gradients(self, plan: PrecisionPlan) -> list[tuple[float, list[np.ndarray]]]:
        if keras.backend.backend() != "tensorflow":
            raise BackendError(
                "the numerical proxy (level 2) needs the TensorFlow backend; "
                f"active backend is {keras.backend.backend()!r}."
            )
        import tensorflow as tf

        self._reset()
        scale = _PROXY_LOSS_SCALE if plan.uses_float16 else 1.0
        plan, _ = self._native_plan(plan)
        apply_plan(self.model, plan)
        if not getattr(self.model, "compiled", False) or self.model.optimizer is None:
            recompile(self.model, self.compile_template)
        variables = weight_variables(self.model)
        model = self.model

        # A compiled function: Keras' float8 gradients do not run eagerly in TensorFlow.
        @tf.function(reduce_retracing=True)
        def loss_and_gradients(x, y):
            with tf.GradientTape() as tape:
                prediction = model(x, training=False)
                loss = model.compute_loss(x=x, y=y, y_pred=prediction, training=False)
                scaled = tf.cast(loss, "float32") * scale
            return loss, tape.gradient(scaled, variables)

        results = []
        for x, y in self.proxy_data:
            loss, gradients = loss_and_gradients(x, y)
            arrays = [
                np.zeros(v.shape, "float32")
                if g is None
                else np.asarray(tf.convert_to_tensor(g), "float64") / scale
                for v, g in zip(variables, gradients)
            ]
            results.append((float(loss), arrays))
        return results

    def step_rounds(
        self, plans: list[PrecisionPlan], rounds: int = 5, steps: int = 5
    ) -> list[list[float]]:
        """Times each plan's train step in interleaved, rotating rounds, each on its own copy."""
        if not self.is_clone:
            figures: list[list[float]] = [[] for _ in plans]
            for round_index in range(rounds):
                for index in rotated(range(len(plans)), round_index):
                    figures[index].append(self.step_seconds(plans[index], steps, warmup=steps))
            return figures
        self._reset()
        x, y = self.train_batches[0]
        copies = [self._timing_copy(plan) for plan in plans]

        def run(copy: keras.Model) -> None:
            for _ in range(steps):
                logs = copy.train_on_batch(x, y, return_dict=True)
            float(next(iter(logs.values())))  # waits for the last step to finish

        try:
            timings = time_interleaved(
                {str(index): functools.partial(run, copy) for index, copy in enumerate(copies)},
                rounds=rounds,
                warmup=1,
            )
        finally:
            del copies
            gc.collect()
        return [
            [seconds / steps for seconds in timings[str(index)].samples]
            for index in range(len(plans))
        ]

    def _timing_copy(self, plan: PrecisionPlan) -> keras.Model:
        """A compiled clone of the working model (its current weights) running `plan` natively."""
        copy = keras.models.clone_model(self.model)
        copy.set_weights(self.model.get_weights())
        self._compile_natively(copy, plan)
        return copy

    def _compile_natively(self, model: keras.Model, plan: PrecisionPlan) -> None:
        """Applies `plan` (float16 native, loss-scaled) to `model` and recompiles it."""
        uses_float16 = apply_plan(model, plan).uses_float16
        recompile(model, self.compile_template)
        if uses_float16:
            _scale_loss(model)

    def step_seconds(self, plan: PrecisionPlan, steps: int = 5, warmup: int = 2) -> float:
        """Measures the median train-step time of the plan on this device (weights reset after)."""
        self._reset()
        if self._emulation is not None:
            self._emulation.set_layers(())  # timing runs float16 natively
        self._compile_natively(self.model, plan)
        x, y = self.train_batches[0]

        def train_step() -> None:
            logs = self.model.train_on_batch(x, y, return_dict=True)
            float(next(iter(logs.values())))  # waits for the step to finish

        timing = time_interleaved({"step": train_step}, rounds=steps, warmup=warmup)["step"]
        self._reset()
        return timing.median


def _scale_loss(model: keras.Model) -> None:
    """Wraps a compiled model's optimizer in the default dynamic loss scale, built."""
    model.optimizer = FlooredLossScaleOptimizer(model.optimizer)
    model.optimizer.build(model.trainable_variables)


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


def trivial_baseline(evaluator: Evaluator, budget: Budget) -> tuple[float, str]:
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
    return float(evaluator.untrained_metrics()[budget.log_name]), "untrained"


def _noise_margin(baseline: float, kind: str, samples: int) -> float:
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
    given = not isinstance(baseline, str)
    value, kind = (float(baseline), "given") if given else trivial_baseline(evaluator, budget)
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
    if budget.worse_by(reference, value) <= _noise_margin(value, kind, samples):
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


#: Seconds the measured ranking may spend adding rounds after its first `MIN_ROUNDS`.
MEASUREMENT_SECONDS = 120.0
#: Steps of one timed round (and of the warm-up before the rounds).
ROUND_STEPS = 5


def measure_until_decided(
    evaluator: Evaluator, plans: Mapping[str, PrecisionPlan], **limits: float
) -> dict[str, list[float]]:
    """Times plans in interleaved rounds until one leads beyond the noise, or a `limits` cap."""
    return time_until_decided(
        lambda names, rounds: measure_step_rounds(evaluator, [plans[n] for n in names], rounds),
        list(plans),
        simplicity,
        **{"max_seconds": MEASUREMENT_SECONDS, **limits},
    )


def measure_step_seconds(
    evaluator: Evaluator, plans: Sequence[PrecisionPlan], rounds: int = 3
) -> list[float]:
    """Times each plan's train step on this device in interleaved rounds: the fastest round."""
    return [min(figures) for figures in measure_step_rounds(evaluator, plans, rounds)]


def measure_step_rounds(
    evaluator: Evaluator, plans: Sequence[PrecisionPlan], rounds: int = 5
) -> list[list[float]]:
    """Times each plan's train step in interleaved, rotating rounds and returns every round."""
    return evaluator.step_rounds(list(plans), rounds=rounds, steps=ROUND_STEPS)
