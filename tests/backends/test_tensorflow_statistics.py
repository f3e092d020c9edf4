"""Tests for autoprec._backends.tensorflow: one tensor's raw statistics on TensorFlow.

Every path of the measurement (plain sums, the rescaled branch for non-finite
or huge values, the exact subnormal exponents, the XLA-friendly ops) is
checked against an independent NumPy reference (`statistics_reference`).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from backends.statistics_reference import SPECIAL, reference_statistics

from autoprec._backends import tensorflow as statistics


def _measured(values, xla: bool = False, multiplier=None) -> tuple[np.ndarray, np.ndarray]:
    counts, floats = statistics.tensor_statistics(tf.constant(values), xla, multiplier)
    return counts.numpy(), floats.numpy()


def _assert_matches(measured, expected) -> None:
    counts, floats = measured
    expected_counts, expected_floats = expected
    assert counts.dtype == np.int64 and floats.dtype == np.float64
    np.testing.assert_array_equal(counts, expected_counts)
    np.testing.assert_allclose(floats, expected_floats, rtol=1e-6)


#: Values whose statistics are exact on every path, as the reference gives them.
CASES = {
    "plain": np.random.default_rng(0).normal(scale=3.0, size=(5, 7, 11)).astype(np.float32),
    # SPECIAL without its subnormals and its magnitudes from 2**127 up (see DEFECTS).
    "special_normal": np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, 0.99999994, -(2.0**-14), 6.0e-8]
        + [3e30, 65504.0, 70000.0, 1e38, 0.25, -3.0],
        np.float32,
    ),
    "huge": np.array([3e30, -1e35, 2.0, 0.0], np.float32),  # squares overflow float32
    "zeros": np.zeros((4, 3), np.float32),
    "non_finite_only": np.array([np.inf, np.nan, -np.inf], np.float32),
}

#: Values whose counts are exact but whose floats are not, on this host (known defects).
DEFECTS = {
    # A float32 subnormal as the smallest magnitude reads as 0.0: the cast to float64
    # flushes it to zero (TensorFlow's CPU kernels run with flush-to-zero).
    "subnormal": np.array([1e-40, 1.0], np.float32),
    # A magnitude from 2**127 up is rescaled by 2**-127, a subnormal factor that is
    # flushed to zero: sum |x| and sum x^2 read as 0.0.
    "largest_binade": np.array([3e38, 1.0], np.float32),
    # Only subnormals: the largest magnitude and the sums read as 0.0 (flushed).
    "only_subnormals": np.array([1e-41, 0.0, 2e-39, -1.4e-45, 1e-38], np.float32),
}


@pytest.mark.parametrize("xla", [False, True], ids=["graph_ops", "xla_ops"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_statistics_match_the_numpy_reference(name, xla):
    values = CASES[name]
    _assert_matches(_measured(values, xla), reference_statistics(values))


@pytest.mark.parametrize("xla", [False, True], ids=["graph_ops", "xla_ops"])
@pytest.mark.parametrize("values", [SPECIAL, *DEFECTS.values()], ids=["special", *DEFECTS])
def test_counts_are_exact_for_subnormals_and_the_largest_magnitudes(values, xla):
    counts, _ = _measured(values, xla)
    np.testing.assert_array_equal(counts, reference_statistics(values)[0])


@pytest.mark.xfail(strict=True, reason="known defect: subnormals flushed to zero (see DEFECTS)")
@pytest.mark.parametrize("name", sorted(DEFECTS))
def test_floats_of_subnormals_and_the_largest_magnitudes(name):
    values = DEFECTS[name]
    _assert_matches(_measured(values), reference_statistics(values))


def test_the_count_layout_is_the_documented_one():
    assert statistics.RAW_COUNT_SLOTS == 256 + 23 + 1
    assert statistics.FLOAT_SLOTS == ("max_abs", "min_nonzero_abs", "sum_abs", "sum_squares")
    counts, floats = _measured(np.array([0.0, 1.0, -3.0, np.inf, np.nan, 0.25], np.float32))
    assert counts[0] == 1 and counts[125] == counts[127] == counts[128] == 1
    assert counts[255] == 2 and counts[-1] == 1  # inf and NaN; one of them NaN
    assert floats.tolist() == [3.0, 0.25, 4.25, 10.0625]


def test_half_precision_tensors_are_measured_in_float32():
    values = np.array([65504.0, -(2.0**-24), 0.5], np.float16)
    _assert_matches(_measured(values), reference_statistics(values.astype(np.float32)))


def test_a_multiplier_is_applied_before_measuring():
    values = np.array([1024.0, -4096.0, 0.0], np.float32)
    measured = _measured(values, multiplier=tf.constant(1.0 / 1024.0))
    _assert_matches(measured, reference_statistics(values / 1024.0))


def test_inside_an_xla_compiled_function_the_statistics_are_the_same():
    values = CASES["special_normal"]

    @tf.function(jit_compile=True)
    def compiled(tensor):
        return statistics.tensor_statistics(tensor, xla=True)

    counts, floats = compiled(tf.constant(values))
    _assert_matches((counts.numpy(), floats.numpy()), reference_statistics(values))


def test_float_slots_combine_by_max_min_and_sum():
    current = tf.constant([2.0, 0.5, 3.0, 5.0], tf.float64)
    new = tf.constant([1.0, 0.25, 1.0, 1.0], tf.float64)
    assert statistics.combine_floats(current, new).numpy().tolist() == [2.0, 0.25, 4.0, 6.0]
    start = tf.constant([0.0, np.inf, 0.0, 0.0], tf.float64)  # an accumulator's first value
    assert statistics.combine_floats(start, new).numpy().tolist() == new.numpy().tolist()
