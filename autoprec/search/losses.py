"""What the compiled loss says about the output layers: may their predictions round to 16 bits?"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import keras

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
