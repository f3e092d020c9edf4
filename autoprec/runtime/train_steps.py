"""Whose train step runs: Keras' own, or the model's, and whether the model's scales its loss.

Loss scaling reaches float16 gradients only through the optimizer that steps, and only
when the train step scales the loss before taking gradients (Keras' own `train_step`
calls `optimizer.scale_loss`). A model with a `train_step` of its own (a keras.io GAN
with a discriminator and a generator optimizer) steps the optimizers it holds; wrapping
`model.optimizer` then scales nothing. `unscaled_float16_reason` says when float16
layers would train that way, so that the plan keeps them out of float16.
"""

from __future__ import annotations

import inspect

import keras

#: Packages whose `train_step` is Keras' own (it scales the loss through `model.optimizer`).
KERAS_PACKAGES = ("keras", "keras_hub", "keras_nlp", "keras_cv", "tf_keras")


def has_own_train_step(model: keras.Model) -> bool:
    """Returns whether `model`'s class defines its own `train_step` (not Keras' or keras-hub's).

    Args:
        model: a Keras model.

    Returns:
        `True` when the class that defines `train_step` lives outside Keras' packages.

    Example:

    ```python
    has_own_train_step(keras.Sequential([keras.layers.Dense(1)]))  # False
    ```
    """
    for cls in type(model).__mro__:
        if "train_step" in vars(cls):
            package = cls.__module__.split(".", 1)[0]
            return package not in KERAS_PACKAGES
    return False


def step_optimizers(model: keras.Model) -> dict[str, keras.optimizers.Optimizer]:
    """Returns `{attribute: optimizer}` of the optimizers `model` holds besides `model.optimizer`.

    Args:
        model: a Keras model.

    Returns:
        The optimizers found among its attributes (e.g. `d_optimizer`, `g_optimizer`).

    Example:

    ```python
    step_optimizers(gan)  # {"d_optimizer": <Adam>, "g_optimizer": <Adam>}
    ```
    """
    found = {}
    for name, value in vars(model).items():
        if name.startswith("_") or name == "optimizer":
            continue
        if isinstance(value, keras.optimizers.Optimizer):
            found[name] = value
    return found


def scales_its_loss(model: keras.Model) -> bool:
    """Returns whether the model's own `train_step` calls `scale_loss` (read from its source).

    Args:
        model: a Keras model with its own `train_step`.

    Returns:
        `True` when the source of `train_step` names `scale_loss`; `False` when it does
        not or cannot be read.

    Example:

    ```python
    scales_its_loss(gan)  # False for the keras.io GAN
    ```
    """
    try:
        source = inspect.getsource(type(model).train_step)
    except (OSError, TypeError):
        return False
    return "scale_loss" in source


def unscaled_float16_reason(model: keras.Model) -> str | None:
    """Says why float16 layers would train without loss scaling, or `None` when they would not.

    Args:
        model: the model a plan is applied to.

    Returns:
        `None` for Keras' own `train_step`, or one of the model's own that calls
        `scale_loss`; else the reason, naming the optimizers that step.

    Example:

    ```python
    unscaled_float16_reason(gan)
    # "model 'gan' trains with its own train_step, which scales no loss ..."
    ```
    """
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
