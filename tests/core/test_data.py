"""The one data adapter: arrays, tf.data, generators and PyDatasets (autoprec/_core/data.py)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from autoprec._core import data
from autoprec.errors import AutoprecError, ProfileError


def _arrays(samples=10):
    rng = np.random.default_rng(0)
    return rng.standard_normal((samples, 3)).astype("float32"), np.arange(samples)


class _Batches(keras.utils.PyDataset):
    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return self.x[index * 4 : index * 4 + 4], self.y[index * 4 : index * 4 + 4]


def test_every_kind_of_data_gives_the_same_numpy_batches():
    x, y = _arrays(8)
    kinds = {
        "arrays": (x, y),
        "dataset": tf.data.Dataset.from_tensor_slices((x, y)).batch(4),
        "generator": ((x[i : i + 4], y[i : i + 4]) for i in (0, 4)),
        "pydataset": _Batches(x, y),
    }
    for kind, value in kinds.items():
        batches = data.take_batches(value, batch_size=4, steps=None, what=kind)
        assert len(batches) == 2, kind
        np.testing.assert_array_equal(batches[1][0], x[4:8])
        np.testing.assert_array_equal(batches[1][1], y[4:8])
        assert isinstance(batches[0][0], np.ndarray), kind


def test_steps_limit_the_batches_and_dicts_of_inputs_are_kept():
    x, y = _arrays(10)
    batches = data.take_batches(({"a": x, "b": x}, y), batch_size=3, steps=2, what="x")
    assert len(batches) == 2
    assert batches[1][0]["b"].shape == (3, 3)
    joined_x, joined_y = data.concatenate_batches(batches)
    assert joined_x["a"].shape == (6, 3)
    np.testing.assert_array_equal(joined_y, y[:6])


def test_bad_data_is_refused_naming_the_argument():
    with pytest.raises(AutoprecError, match="validation_data must be an"):
        data.take_batches(42, batch_size=4, steps=1, what="validation_data")
    with pytest.raises(ProfileError, match="search: x must yield"):
        data.take_batches([np.zeros(3)], 4, None, "search: x", error_class=ProfileError)
    with pytest.raises(AutoprecError, match="holds no batch"):
        data.take_batches(iter([]), 4, None, "x")


def test_batch_parts():
    x, y = _arrays(6)
    assert data.input_part((x, y)) is x
    assert data.target_part((x, y, np.ones(6))) is y
    assert data.target_part(x) is None
    assert data.input_part([x, x]) == [x, x]  # a list is a multi-input model's inputs
    assert data.target_part([x, y]) is None
    assert data.input_part(tf.data.Dataset.from_tensor_slices((x, y)).batch(2)).shape == (2, 3)
    assert data.batch_size_of({"a": [x]}) == 6
    assert data.slice_batch({"a": (x, x)}, 2)["a"][1].shape == (2, 3)
    with pytest.raises(ProfileError, match="holds no arrays"):
        data.batch_size_of("text", error_class=ProfileError)


def test_fit_arguments_cover_the_steps_for_each_kind():
    x, y = _arrays(10)
    arguments, sample = data.fit_arguments((x, y), steps=7, batch_size=4, what="profile")
    assert arguments["epochs"] == 3 and arguments["batch_size"] == 4
    assert sample.shape == (4, 3)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(5)
    arguments, sample = data.fit_arguments(dataset, steps=5, batch_size=4, what="profile")
    assert arguments["epochs"] == 3 and sample.shape == (5, 3)
    arguments, sample = data.fit_arguments(iter([(x, y)]), 3, 4, "profile")
    assert arguments["steps_per_epoch"] == 3 and sample is x
    with pytest.raises(ProfileError, match="profile: the dataset is empty"):
        data.fit_arguments(dataset.take(0), 1, 4, "profile", error_class=ProfileError)
    with pytest.raises(ProfileError, match="profile: unsupported data of type int"):
        data.fit_arguments(3, 1, 4, "profile", error_class=ProfileError)
