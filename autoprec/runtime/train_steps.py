"""Whose train step runs: Keras' own, or the model's, and whether the model's scales its loss."""

from __future__ import annotations

import inspect

import keras

#: Packages whose `train_step` is Keras' own (it scales the loss through `model.optimizer`).
KERAS_PACKAGES = ("keras", "keras_hub", "keras_nlp", "keras_cv", "tf_keras")


def has_own_train_step(model: keras.Model) -> bool:
    """Returns whether `model`'s class defines its own `train_step` (not Keras' or keras-hub's)."""
    for cls in type(model).__mro__:
        if "train_step" in vars(cls):
            package = cls.__module__.split(".", 1)[0]
            return package not in KERAS_PACKAGES
    return False


def step_optimizers(model: keras.Model) -> dict[str, keras.optimizers.Optimizer]:
    """Returns `{attribute: optimizer}` of the optimizers `model` holds besides `model.optimizer`."""
    found = {}
    for name, value in vars(model).items():
        if name.startswith("_") or name == "optimizer":
            continue
        if isinstance(value, keras.optimizers.Optimizer):
            found[name] = value
    return found


def scales_its_loss(model: keras.Model) -> bool:
    """Returns whether the model's own `train_step` calls `scale_loss` (read from its source)."""
    try:
        source = inspect.getsource(type(model).train_step)
    except (OSError, TypeError):
        return False
    return "scale_loss" in source


def unscaled_float16_reason(model: keras.Model) -> str | None:
    """Says why float16 layers would train without loss scaling, or `None` when they would not."""
    if not has_own_train_step(model) or scales_its_loss(model):
        return None
    optimizers = sorted(step_optimizers(model))
    stepping = (
        f"its optimizers ({', '.join(optimizers)})" if optimizers else "the optimizers it uses"
    )
    return (
        f"model {model.name!r} trains with its own train_step, which scales no loss before "
        f"taking gradients: {stepping} would step float16 gradients unscaled (small ones "
        "flush to zero). To train those layers in float16, wrap each optimizer in "
        "keras.optimizers.LossScaleOptimizer and take gradients of optimizer.scale_loss(loss)"
    )
