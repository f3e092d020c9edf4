"""Tests for autoprec.profiler.tensor_stats: statistics from a backend's raw accumulators."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from profiler.reference import assert_matches_reference

from autoprec._backends import tensorflow as tf_backend
from autoprec.profiler import TensorStats

_SPECIAL_VALUES = np.array(
    [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        1.0,
        np.nextafter(np.float32(1.0), np.float32(0.0)),
        -(2.0**-14),
        6.0e-8,
        1e-40,  # float32 subnormal
        -1.4e-45,  # smallest float32 subnormal
        3e30,  # forces the rescaled branch for the sums
        65504.0,
        70000.0,
    ],
    dtype=np.float32,
)


_KNOWN_TENSORS = {
    "normal": np.random.default_rng(1).normal(scale=3.0, size=(5, 7, 11)).astype(np.float32),
    "special": np.concatenate([_SPECIAL_VALUES, np.linspace(-5, 5, 50, dtype=np.float32)]),
    "zeros": np.zeros((4, 3), np.float32),
    "subnormal": np.array([1e-41, 0.0, 2e-39], np.float32),  # only subnormals and zeros
}


@pytest.mark.parametrize("xla", [False, True], ids=["graph", "xla"])
def test_statistics_of_known_tensors_match_numpy(xla):
    for name, values in _KNOWN_TENSORS.items():
        accumulator = tf_backend.TensorAccumulator(name)

        @tf.function(jit_compile=xla)
        def update(tensor, accumulator=accumulator):
            accumulator.update(tensor, xla)

        update(tf.constant(values))
        update(tf.constant(values))
        stats = TensorStats.from_raw(*accumulator.read())
        assert_matches_reference(stats, np.concatenate([values.ravel(), values.ravel()]))


def test_statistics_of_half_precision_tensors_are_exact():
    values = np.array([65504.0, 6e-8, 2.0**-24, 1.0, -3.5, 0.0], np.float32)
    for dtype in ("float16", "bfloat16"):
        accumulator = tf_backend.TensorAccumulator(dtype)
        tensor = tf.cast(tf.constant(values), dtype)
        accumulator.update(tensor, xla=False)
        stats = TensorStats.from_raw(*accumulator.read())
        assert_matches_reference(stats, tf.cast(tensor, "float32").numpy())
