"""What a reloaded model must show: the trained model's outputs, bitwise."""

from __future__ import annotations

import keras
import numpy as np


def assert_same_outputs(model: keras.Model, reloaded: keras.Model, x) -> None:
    """Asserts both models' eager outputs on `x` are bitwise equal.

    Eager calls: two traces of one compiled predict function may differ by an ulp.
    """
    expected = keras.ops.convert_to_numpy(model(x, training=False))
    assert np.array_equal(expected, keras.ops.convert_to_numpy(reloaded(x, training=False)))
