"""One read of a model per state: values computed from a live model, kept while it is unchanged.

Describing a model's layers and tracing its forward pass are the reads every stage
needs (the cost model, the heuristic, the search, the kernel check, `estimate`).
`ModelMemo` keeps the value of one read per model and key (the model's structure,
its policies, a batch signature), so a decision reads the model once per batch
signature however many stages ask. Entries go when the model is garbage
collected; `reads` and `hits` count what was computed and what was reused.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import keras

Value = TypeVar("Value")

#: Keys kept per model and memo: a model read at a few batch signatures keeps each.
KEYS_PER_MODEL = 8


class ModelMemo:
    """Keeps one computed value per live model and key, and counts reads and reuses.

    Args:
        name: what the memo holds, for messages (`"descriptions"`).

    Example:

    ```python
    memo = ModelMemo("layer counts")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    memo.get(model, structure_key(model), lambda: len(model.layers))  # 1, read
    memo.get(model, structure_key(model), lambda: len(model.layers))  # 1, reused
    (memo.reads, memo.hits)  # (1, 1)
    ```
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.reads = 0
        self.hits = 0
        self._entries: weakref.WeakKeyDictionary[Any, dict[Hashable, Any]] = (
            weakref.WeakKeyDictionary()
        )

    def get(self, model: Any, key: Hashable, read: Callable[[], Value]) -> Value:
        """Returns the value kept for `model` and `key`, reading it with `read()` the first time.

        Args:
            model: the live object the value is computed from (held weakly).
            key: what the value depends on besides the object's identity.
            read: computes the value.

        Returns:
            The kept value, or the one `read()` returned.
        """
        try:
            kept = self._entries.setdefault(model, {})
        except TypeError:  # not weakly referenceable: read every time
            self.reads += 1
            return read()
        if key in kept:
            self.hits += 1
            return kept[key]
        value = read()
        self.reads += 1
        if len(kept) >= KEYS_PER_MODEL:
            kept.pop(next(iter(kept)))
        kept[key] = value
        return value

    def clear(self) -> None:
        """Forgets every kept value (the counts stay)."""
        self._entries.clear()

    def __len__(self) -> int:
        """Returns how many live models have values kept."""
        return len(self._entries)

    def __repr__(self) -> str:
        return f"ModelMemo({self.name!r}, reads={self.reads}, hits={self.hits})"


def structure_key(model: keras.layers.Layer) -> tuple:
    """Returns a key that changes when a model is built, rebuilt or gains or loses variables.

    Args:
        model: any Keras layer or model.

    Returns:
        A hashable tuple: whether the model is built, and the identity and shape
        of each of its variables.

    Example:

    ```python
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    structure_key(model) == structure_key(model)  # True
    ```
    """
    return (
        bool(getattr(model, "built", False)),
        tuple((id(variable), tuple(variable.shape)) for variable in model.weights),
    )
