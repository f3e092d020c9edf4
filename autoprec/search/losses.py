"""What the compiled loss says about the output layers: may their predictions round to 16 bits?

A classification loss (cross-entropy, hinge) reads class scores, which Keras casts to
float32 before the loss: rounding them to 16 bits changes no decision. A regression
loss reads the values themselves, and an output rounded to 16 bits puts an error floor
on it that no training removes (bfloat16 keeps 8 significant bits: a relative error up
to 2^-9). That floor is budget evidence: the plan keeps such an output layer in float32.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import keras

#: Words in a loss's name that make it a classification loss (outputs may round to 16 bits).
CLASSIFICATION_LOSS_WORDS = ("crossentropy", "hinge")


def loss_names(model: keras.Model) -> list[str]:
    """Returns the names of the losses `model` is compiled with, one per output that has one.

    Args:
        model: a Keras model, compiled or not.

    Returns:
        The names (strings as given, else the loss object's or function's name); empty
        when the model is not compiled with a loss.

    Example:

    ```python
    model.compile("adam", "mse")
    loss_names(model)  # ["mse"]
    ```
    """

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
    """Returns whether every loss `model` is compiled with is a classification loss.

    Args:
        model: a compiled model.

    Returns:
        `True` for cross-entropy or hinge losses (strings, `keras.losses` objects or
        functions, for each output); `False` for any other loss, or none.

    Example:

    ```python
    model.compile("adam", "sparse_categorical_crossentropy")
    has_classification_loss(model)  # True
    ```
    """
    names = loss_names(model)
    return bool(names) and all(
        any(word in name.lower().replace("_", "") for word in CLASSIFICATION_LOSS_WORDS)
        for name in names
    )


def rounding_floor_outputs(model: keras.Model, outputs: Iterable[str]) -> dict[str, str]:
    """Returns `{path: reason}` for the output layers whose 16-bit rounding would floor the loss.

    They are the model's output layers when the model is compiled with a loss that is
    not a classification loss (`has_classification_loss`); none when it is, or when
    the model is not compiled with a loss (the loss is then unknown: outputs round as
    Keras' own mixed policies round them).

    Args:
        model: the model.
        outputs: the paths of its output layers (`output_layers`).

    Returns:
        `{path: reason}`, each reason naming the loss.

    Example:

    ```python
    model.compile("adam", "mse")
    rounding_floor_outputs(model, {"head"})  # {"head": "the loss 'mse' reads ..."}
    ```
    """
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
