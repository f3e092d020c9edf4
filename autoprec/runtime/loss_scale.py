"""Loss scaling: `LossScale` settings and a Keras `LossScaleOptimizer` whose scale keeps a floor."""

from __future__ import annotations

import dataclasses
import math

import keras
from keras import ops

from .._backends import instrument_backend
from .._core.models import ConfigValue, strategy_scope, sync_fit_state
from ..errors import PlanError


@dataclasses.dataclass(frozen=True)
class LossScale(ConfigValue):
    """How the loss is scaled while layers train in float16: a dynamic scale with a floor, or a fixed one.

    `AutoPrecision(loss_scale=...)` takes one of these, `"dynamic"` (the default `LossScale()`), a
    positive number (`LossScale(number, dynamic=False)`) or `None` (no loss scaling, refused when a
    layer runs in float16, whose small gradients underflow without it). A frozen value that
    `get_config()` and `LossScale.from_config(config)` round-trip through a plain dict.

    Attributes:
        initial: the starting scale.
        floor: with a dynamic scale, it never drops below this (Keras' own has no floor and
            reaches 0.0 after ~140 overflowing steps); `None` for none.
        growth_steps: finite steps after which a dynamic scale doubles.
        dynamic: `True` halves the scale on an overflowing step and doubles it after
            `growth_steps` finite ones; `False` keeps `initial` (an overflowing step is skipped).

    Raises:
        PlanError: for a scale or floor that is not a positive number, a floor above `initial`,
            or `growth_steps` below 1.

    Example:

    ```python
    scale = autoprec.LossScale(initial=2**12, floor=2.0)
    model.fit(x, y, callbacks=[autoprec.AutoPrecision(plan, loss_scale=scale)])
    ```
    """

    initial: float = 2.0**15
    floor: float | None = 1.0
    growth_steps: int = 2000
    dynamic: bool = True

    def __post_init__(self) -> None:
        if not is_positive_number(self.initial):
            raise PlanError(f"LossScale: initial must be a positive number, got {self.initial!r}.")
        if self.floor is not None and not is_positive_number(self.floor):
            raise PlanError(
                f"LossScale: floor must be a positive number or None, got {self.floor!r}."
            )
        if self.dynamic and self.floor is not None and self.floor > self.initial:
            raise PlanError(
                f"LossScale: floor {self.floor:g} is above initial {self.initial:g}; "
                "lower the floor or raise the initial scale."
            )
        steps = self.growth_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise PlanError(f"LossScale: growth_steps must be an integer >= 1, got {steps!r}.")
        if not isinstance(self.dynamic, bool):
            raise PlanError(f"LossScale: dynamic must be True or False, got {self.dynamic!r}.")


def resolve_loss_scale(loss_scale: LossScale | str | float | None, where: str) -> LossScale | None:
    """Returns the `LossScale` a `loss_scale=` argument means, or `None` for no loss scaling."""
    if loss_scale is None or isinstance(loss_scale, LossScale):
        return loss_scale
    if loss_scale == "dynamic":
        return LossScale()
    if is_positive_number(loss_scale):
        return LossScale(initial=float(loss_scale), floor=None, dynamic=False)
    raise PlanError(
        f"{where}: loss_scale={loss_scale!r} is not valid; use 'dynamic', a positive number "
        "for a fixed scale, an autoprec.LossScale(initial=..., floor=..., growth_steps=...), "
        "or None (no loss scaling, only without float16 layers)."
    )


def is_positive_number(value: object) -> bool:
    """Returns whether `value` is a finite number above 0 (not a bool)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


@keras.saving.register_keras_serializable(package="autoprec")
class FlooredLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Dynamic loss scaling with a floor, a fixed-scale mode and counters of skipped steps."""

    scales_loss = True  # `step_skipping_optimizer` sets False: scale 1, nothing to unscale

    def __init__(
        self,
        inner_optimizer: keras.optimizers.Optimizer,
        initial_scale: float = 2.0**15,
        dynamic_growth_steps: int = 2000,
        floor: float | None = 1.0,
        fixed: bool = False,
        name: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(
            inner_optimizer,
            initial_scale=initial_scale,
            dynamic_growth_steps=dynamic_growth_steps,
            name=name,
            **kwargs,
        )
        if floor is not None and floor <= 0:
            raise ValueError(f"floor must be positive or None, got {floor}.")
        if floor is not None and initial_scale < floor:
            raise ValueError(f"initial_scale {initial_scale} is below the floor {floor}.")
        self.floor = floor
        self.fixed = bool(fixed)

    def build(self, var_list) -> None:
        super().build(var_list)
        for name in ("non_finite_steps", "consecutive_non_finite_steps"):
            variable = self.add_variable(
                shape=(), dtype="int", initializer="zeros", aggregation="none", name=name
            )
            setattr(self, name, variable)

    def check_finite(self, grads):
        # One float32 sum a gradient (half the ops of Keras' `isfinite` + `all`): any NaN or inf
        # makes the total non-finite, a finite one past 3.4e38 counts as overflow. Every replica
        # skips when one's gradients are not finite; an `IndexedSlices` is checked by its values.
        backend = instrument_backend() if keras.backend.backend() == "tensorflow" else None
        values = backend.slice_values(grads) if backend else grads
        sums = [ops.sum(ops.cast(g, "float32")) for g in values if g is not None]
        finite = ops.isfinite(ops.sum(ops.stack(sums))) if sums else ops.convert_to_tensor(True)
        return backend.every_replica(finite) if backend else finite

    def _lowered_scale(self):
        if self.fixed:
            return self.dynamic_scale
        halved = ops.multiply(self.dynamic_scale, 0.5)
        if self.floor is None:
            return halved
        return ops.maximum(halved, ops.cast(self.floor, "float32"))

    def _stateful_handle_non_finite_grads(self) -> None:
        self.step_counter.assign(0)
        self.dynamic_scale.assign(self._lowered_scale())
        self.non_finite_steps.assign_add(1)
        self.consecutive_non_finite_steps.assign_add(1)

    def _stateful_handle_finite_grads(self, grads, trainable_variables) -> None:
        if self.fixed:
            tvs = trainable_variables or self._trainable_variables
            unscaled = [
                g
                if g is None or not self.scales_loss or self._overwrite_variable_with_gradient(v)
                else ops.divide(g, self.dynamic_scale)
                for g, v in zip(grads, tvs)
            ]  # a step-skipping wrapper's scale is 1: no pass over the gradients
            self.inner_optimizer.apply(unscaled, trainable_variables=trainable_variables)
        else:
            super()._stateful_handle_finite_grads(grads, trainable_variables)
        self.consecutive_non_finite_steps.assign(0)

    def _stateless_handle_non_finite_grads(self, optimizer_variables, trainable_variables):
        mapping = list(zip(self.variables, optimizer_variables))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            self._stateful_handle_non_finite_grads()
        new_optimizer_variables = [scope.get_current_value(v) for v in self.variables]
        return trainable_variables, new_optimizer_variables

    def _stateless_handle_finite_grads(self, optimizer_variables, grads, trainable_variables):
        new_trainable, new_optimizer_variables = super()._stateless_handle_finite_grads(
            optimizer_variables, grads, trainable_variables
        )
        own_count = len(self._variables)
        own = list(new_optimizer_variables[:own_count])
        for index, variable in enumerate(self._variables):
            if variable is self.consecutive_non_finite_steps:
                own[index] = ops.zeros_like(own[index])
            elif self.fixed and variable is self.dynamic_scale:
                own[index] = optimizer_variables[index]
        return new_trainable, own + list(new_optimizer_variables[own_count:])

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({"floor": self.floor, "fixed": self.fixed})
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        inner = keras.saving.deserialize_keras_object(
            config.pop("inner_optimizer"), custom_objects=custom_objects
        )
        return cls(inner, **config)


def step_skipping_optimizer(
    inner_optimizer: keras.optimizers.Optimizer,
) -> FlooredLossScaleOptimizer:
    """Returns `inner_optimizer` wrapped, unscaled, to skip (and count) non-finite steps."""
    wrapped = FlooredLossScaleOptimizer(inner_optimizer, initial_scale=1.0, floor=None, fixed=True)
    wrapped.scales_loss = False
    return wrapped


def scales_loss(optimizer) -> bool:
    """Returns whether `optimizer` scales the loss (a step-skipping wrapper does not)."""
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer) and getattr(
        optimizer, "scales_loss", True
    )


def current_loss_scale(optimizer) -> float | None:
    """Returns the optimizer's current loss scale, or `None` if it does no loss scaling."""
    if not scales_loss(optimizer):
        return None
    if not optimizer.built:
        return float(optimizer.initial_scale)
    return float(ops.convert_to_numpy(optimizer.dynamic_scale))


def wrap_optimizer(
    model: keras.Model, settings: LossScale | None, where: str
) -> keras.optimizers.Optimizer | None:
    """Wraps `model.optimizer` to scale the loss by `settings`, or (`None`) only to skip non-finite
    steps; returns the optimizer replaced, `None` where it was wrapped so already."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        raise PlanError(f"{where}: the model has no optimizer; compile it before fit.")
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) and (
        settings is None or scales_loss(optimizer)
    ):
        return None
    sync_fit_state(model)  # JAX's fit holds the old optimizer's state: write it back first
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer  # a step-skipping wrapper: scale it now
        model.optimizer = optimizer
    with strategy_scope(model):
        if settings is None:
            wrapped = step_skipping_optimizer(optimizer)
        else:
            wrapped = FlooredLossScaleOptimizer(
                optimizer,
                initial_scale=float(settings.initial),
                dynamic_growth_steps=settings.growth_steps,
                floor=settings.floor if settings.dynamic else None,
                fixed=not settings.dynamic,
            )
        wrapped.build(model.trainable_variables)
    model.optimizer = wrapped
    return optimizer


def is_dynamic_scale(optimizer) -> bool:
    """Returns whether `optimizer` scales the loss with a dynamic scale that can be set now."""
    return scales_loss(optimizer) and optimizer.built and not getattr(optimizer, "fixed", False)
