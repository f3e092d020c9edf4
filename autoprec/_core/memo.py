"""One read of a model per state: values computed from a live model, kept while it is unchanged."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import keras

Value = TypeVar("Value")

#: Keys kept per model and memo: a model read at a few batch signatures keeps each.
KEYS_PER_MODEL = 8


class ModelMemo:
    """Keeps one computed value per live model and key, and counts reads and reuses."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.reads = 0
        self.hits = 0
        self._entries: weakref.WeakKeyDictionary[Any, dict[Hashable, Any]] = (
            weakref.WeakKeyDictionary()
        )

    def get(self, model: Any, key: Hashable, read: Callable[[], Value]) -> Value:
        """Returns the value kept for `model` and `key`, reading it with `read()` the first time."""
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
    """Returns a key that changes when a model is built, rebuilt or gains or loses variables."""
    return (
        bool(getattr(model, "built", False)),
        tuple((id(variable), tuple(variable.shape)) for variable in model.weights),
    )
