"""A Keras `LossScaleOptimizer` whose dynamic loss scale never falls below a floor."""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="autoprec")
class FlooredLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Dynamic loss scaling with a floor, a fixed-scale mode and counters of skipped steps.

    Keras' own dynamic loss scale halves on every step with non-finite gradients
    and has no floor: after ~140 bad steps in a row it is 0.0 and the next step
    writes NaN into the weights. This optimizer halves down to `floor` and no
    further; the bad step is still skipped, so the weights never see a non-finite
    update. It also counts non-finite steps, in total and in a row, so a guard can
    tell a collapsing scale from a single overflow. All bookkeeping happens inside
    the compiled step (no host synchronisation).

    Args:
        inner_optimizer: the `keras.optimizers.Optimizer` to wrap.
        initial_scale: the starting loss scale.
        dynamic_growth_steps: double the scale after this many finite steps.
        floor: the smallest scale; `None` restores Keras' behaviour.
        fixed: if `True`, the scale never changes (non-finite steps are still skipped).
        name: optimizer name.

    Example:

    ```python
    optimizer = autoprec.FlooredLossScaleOptimizer(keras.optimizers.Adam(), floor=1.0)
    model.compile(optimizer=optimizer, loss="mse")
    ```
    """

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
        self.non_finite_steps = self.add_variable(
            shape=(), dtype="int", initializer="zeros", aggregation="none", name="non_finite_steps"
        )
        self.consecutive_non_finite_steps = self.add_variable(
            shape=(),
            dtype="int",
            initializer="zeros",
            aggregation="none",
            name="consecutive_non_finite_steps",
        )

    def _lowered_scale(self):
        if self.fixed:
            return self.dynamic_scale
        halved = ops.multiply(self.dynamic_scale, 0.5)
        if self.floor is None:
            return halved
        # Never below the floor by halving, but a scale set below it (by the guard,
        # for gradients too large even at the floor) is not raised back.
        floor = ops.minimum(self.dynamic_scale, ops.cast(self.floor, "float32"))
        return ops.maximum(halved, floor)

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
                if g is None or self._overwrite_variable_with_gradient(v)
                else ops.divide(g, self.dynamic_scale)
                for g, v in zip(grads, tvs)
            ]
            self.inner_optimizer.apply(unscaled, trainable_variables=trainable_variables)
        else:
            super()._stateful_handle_finite_grads(grads, trainable_variables)
        self.consecutive_non_finite_steps.assign(0)

    def _stateless_handle_non_finite_grads(self, optimizer_variables, trainable_variables):
        mapping = list(zip(self.variables, optimizer_variables))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            self.step_counter.assign(0)
            self.dynamic_scale.assign(self._lowered_scale())
            self.non_finite_steps.assign_add(1)
            self.consecutive_non_finite_steps.assign_add(1)
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
    """Returns `inner_optimizer` wrapped to skip (and count) steps with non-finite gradients, unscaled.

    The loss scale is fixed at 1, so nothing is scaled: this is what a plan with
    bfloat16 but no float16 layers gets while the guard is on (bfloat16 has
    float32's range and needs no loss scaling, but a NaN must still never reach
    the weights). `current_loss_scale` reports `None` for it.

    Args:
        inner_optimizer: the optimizer to wrap.

    Returns:
        A `FlooredLossScaleOptimizer` with `fixed=True` and scale 1.

    Example:

    ```python
    model.optimizer = step_skipping_optimizer(model.optimizer)
    ```
    """
    wrapped = FlooredLossScaleOptimizer(inner_optimizer, initial_scale=1.0, floor=None, fixed=True)
    wrapped.scales_loss = False
    return wrapped


def scales_loss(optimizer) -> bool:
    """Returns whether `optimizer` scales the loss (a step-skipping wrapper does not).

    Args:
        optimizer: a Keras optimizer.

    Returns:
        `True` for a `LossScaleOptimizer` other than a `step_skipping_optimizer`.

    Example:

    ```python
    scales_loss(model.optimizer)
    ```
    """
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
