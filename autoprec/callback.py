"""`AutoPrecision`: the Keras callback that trains a model with a per-layer precision plan."""

from __future__ import annotations

import os

import keras

from . import _dtypes
from .apply import PlanHandle, apply_plan
from .errors import PlanError
from .layers import is_fully_built
from .loss_scale import FlooredLossScaleOptimizer, current_loss_scale
from .plan import PrecisionPlan
from .saving import attach_plan


class AutoPrecision(keras.callbacks.Callback):
    """Trains with a per-layer precision plan, adding loss scaling whenever a layer runs in float16.

    At the start of training the plan is applied to every layer (sub-layers
    included), the optimizer is wrapped in a `FlooredLossScaleOptimizer` when any
    layer computes in float16 (Keras does this only when the global policy is
    exactly `mixed_float16`), and the compiled train/test/predict functions are
    rebuilt so the new policies take effect. The optimizer's state is kept; an
    optimizer that already scales the loss is not wrapped again. The current loss
    scale is added to the epoch logs (`history.history["loss_scale"]`). An
    unbuilt subclassed model only gets its sub-layers at the first trace, so its
    first step runs with the model's own policies and the plan applies from the
    second step on. The plan
    stays applied after training, so `evaluate`, `predict` and
    `autoprec.save_model` use it; `restore()` undoes it.

    Args:
        plan: a `PrecisionPlan` or the path of a plan JSON file.
        loss_scale: `"dynamic"` (start at 2**15, halve on overflow, double after
            `dynamic_growth_steps` finite steps), a number for a fixed scale, or
            `None` for no loss scaling (refused when a layer runs in float16).
        loss_scale_floor: the dynamic scale never drops below this (Keras' own
            has no floor and reaches 0.0 after ~140 overflowing steps).
        dynamic_growth_steps: finite steps before the dynamic scale doubles.
        strict: passed to `apply_plan`: refuse a plan that does not fit the model.
        plan_path: if given, the plan as applied is saved there at the end of training.
        verbose: 1 prints one line when the plan is applied, 0 is silent.

    Example:

    ```python
    plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    model.fit(x, y, epochs=2, callbacks=[autoprec.AutoPrecision(plan)])
    ```
    """

    def __init__(
        self,
        plan: PrecisionPlan | str | os.PathLike,
        loss_scale: str | float | None = "dynamic",
        loss_scale_floor: float = 1.0,
        dynamic_growth_steps: int = 2000,
        strict: bool = True,
        plan_path: str | os.PathLike | None = None,
        verbose: int = 1,
    ) -> None:
        super().__init__()
        if isinstance(plan, (str, os.PathLike)):
            plan = PrecisionPlan.load(plan)
        if not isinstance(plan, PrecisionPlan):
            raise PlanError(
                "AutoPrecision: 'plan' must be a PrecisionPlan or a plan JSON path, got "
                f"{type(plan).__name__}."
            )
        if isinstance(loss_scale, str) and loss_scale != "dynamic":
            raise PlanError(
                f"AutoPrecision: loss_scale={loss_scale!r} is not valid; use 'dynamic', "
                "a positive number for a fixed scale, or None."
            )
        if not isinstance(loss_scale, str) and loss_scale is not None and loss_scale <= 0:
            raise PlanError(f"AutoPrecision: loss_scale must be positive, got {loss_scale}.")
        if loss_scale is None and plan.uses_float16:
            raise PlanError(
                "AutoPrecision: loss_scale=None, but the plan runs layers in float16, whose "
                "gradients underflow without loss scaling. Use loss_scale='dynamic' (default)."
            )
        self.plan = plan
        self.loss_scale = loss_scale
        self.loss_scale_floor = loss_scale_floor
        self.dynamic_growth_steps = dynamic_growth_steps
        self.strict = strict
        self.plan_path = plan_path
        self.verbose = verbose
        self.handle: PlanHandle | None = None
        self._wrapped_optimizer: keras.optimizers.Optimizer | None = None
        self._pending = False

    # ------------------------------------------------------------------ Keras hooks

    def on_train_begin(self, logs=None) -> None:
        if not is_fully_built(self.model):
            # An unbuilt subclassed model gets its sub-layers (and their paths) at
            # the first trace: apply the plan right after the first step.
            self._pending = True
            return
        self._apply()

    def on_train_batch_end(self, batch, logs=None) -> None:
        if self._pending:
            self._pending = False
            self._apply()

    def _apply(self) -> None:
        self.handle = apply_plan(self.model, self.plan, strict=self.strict)
        self.plan = self.handle.plan
        attach_plan(self.model, self.plan)
        if self.handle.uses_float16:
            if self.loss_scale is None:
                raise PlanError(
                    "AutoPrecision: loss_scale=None, but layers "
                    f"{_float16_layers(self.handle)[:3]} run in float16; use 'dynamic'."
                )
            self._ensure_loss_scaling()
        self._rebuild_compiled_functions()
        if self.verbose:
            counts = {dtype: 0 for dtype in _dtypes.COMPUTE_DTYPES}
            for dtype in self.handle.dtypes.values():
                counts[dtype] += 1
            scaling = current_loss_scale(self.model.optimizer)
            print(
                "autoprec: plan applied to "
                + ", ".join(f"{count} {dtype}" for dtype, count in counts.items() if count)
                + " layer(s)"
                + (f"; loss scale {scaling:g}" if scaling is not None else "")
            )

    def on_epoch_end(self, epoch, logs=None) -> None:
        scale = current_loss_scale(self.model.optimizer)
        if logs is not None and scale is not None:
            logs["loss_scale"] = scale

    def on_train_end(self, logs=None) -> None:
        plan = self.current_plan()
        attach_plan(self.model, plan)
        if self.plan_path is not None:
            plan.save(self.plan_path)

    # ------------------------------------------------------------------ helpers

    def current_plan(self) -> PrecisionPlan:
        """Returns the plan as applied, with the loss-scale settings recorded in its metadata."""
        scale = current_loss_scale(self.model.optimizer) if self.model is not None else None
        if scale is None:
            return self.plan
        return self.plan.with_metadata(
            loss_scale={
                "mode": "fixed" if not isinstance(self.loss_scale, str) else "dynamic",
                "current": scale,
                "floor": self.loss_scale_floor,
                "dynamic_growth_steps": self.dynamic_growth_steps,
            }
        )

    def restore(self) -> None:
        """Undoes the plan: original policies back, the optimizer unwrapped if this callback wrapped it."""
        if self.handle is not None:
            self.handle.restore()
        if self._wrapped_optimizer is not None and self.model is not None:
            self.model.optimizer = self._wrapped_optimizer
            self._wrapped_optimizer = None

    def _ensure_loss_scaling(self) -> None:
        optimizer = self.model.optimizer
        if optimizer is None:
            raise PlanError("AutoPrecision: the model has no optimizer; compile it before fit.")
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            return
        fixed = not isinstance(self.loss_scale, str)
        initial_scale = float(self.loss_scale) if fixed else 2.0**15
        floor = None if fixed else self.loss_scale_floor
        with _strategy_scope(self.model):
            wrapped = FlooredLossScaleOptimizer(
                optimizer,
                initial_scale=initial_scale,
                dynamic_growth_steps=self.dynamic_growth_steps,
                floor=floor,
                fixed=fixed,
            )
            wrapped.build(self.model.trainable_variables)
        self._wrapped_optimizer = optimizer
        self.model.optimizer = wrapped

    def _rebuild_compiled_functions(self) -> None:
        # fit built its train function before on_train_begin; setting it to None
        # here would break fit, so force a rebuild instead.
        self.model.make_train_function(force=True)
        self.model.test_function = None
        self.model.predict_function = None


def _float16_layers(handle: PlanHandle) -> list[str]:
    return [path for path, dtype in handle.dtypes.items() if dtype == _dtypes.FLOAT16]


class _NullScope:
    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False


def _strategy_scope(model):
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None and hasattr(strategy, "scope"):
        return strategy.scope()
    return _NullScope()
