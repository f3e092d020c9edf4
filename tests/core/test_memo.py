"""Tests for autoprec._core.models: one read of a model per state, kept while it is unchanged."""

from __future__ import annotations

import gc

import keras

from autoprec._core.models import KEYS_PER_MODEL, ModelMemo, structure_key


def _dense_model() -> keras.Model:
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])


def test_a_value_is_read_once_per_model_and_key():
    memo = ModelMemo("sizes")
    first, second = _dense_model(), _dense_model()
    reads = []

    def read(model):
        reads.append(model)
        return len(model.layers)

    for _ in range(3):
        assert memo.get(first, "a", lambda: read(first)) == 2
    memo.get(second, "a", lambda: read(second))
    memo.get(first, "b", lambda: read(first))
    assert reads == [first, second, first]
    assert (memo.reads, memo.hits) == (3, 2)
    assert "reads=3" in repr(memo)


def test_values_go_with_their_model_and_old_keys_make_room():
    memo = ModelMemo("sizes")
    model = _dense_model()
    for key in range(KEYS_PER_MODEL + 2):
        memo.get(model, key, lambda: 1)
    memo.get(model, 0, lambda: 1)  # the oldest key was dropped: read again
    assert memo.reads == KEYS_PER_MODEL + 3
    assert len(memo) == 1
    del model
    gc.collect()
    assert len(memo) == 0


def test_the_structure_key_changes_when_a_model_is_built_or_gains_variables():
    model = keras.Sequential([keras.layers.Dense(3)])
    unbuilt = structure_key(model)
    model.build((None, 4))
    built = structure_key(model)
    assert unbuilt != built
    assert structure_key(model) == built
    model.add(keras.layers.Dense(2))
    model.build((None, 4))
    assert structure_key(model) != built


def test_an_object_without_weak_references_is_read_every_time():
    memo = ModelMemo("numbers")
    assert memo.get(3, "k", lambda: "a") == "a"
    assert memo.get(3, "k", lambda: "b") == "b"
    assert memo.reads == 2
