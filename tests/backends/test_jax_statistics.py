"""Tests for autoprec._backends.jax_probes: one tensor's raw statistics on JAX, and host totals.

The measurement needs JAX only (no Keras backend), so it runs in this process,
eagerly and under `jax.jit`, against the NumPy reference
(`statistics_reference`) and against TensorFlow's measurement of the same values.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from backends.statistics_reference import SPECIAL, reference_statistics

from autoprec._backends import tensorflow as tensorflow_statistics

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
statistics = pytest.importorskip("autoprec._backends.jax_probes")

CASES = {
    "plain": np.random.default_rng(0).normal(scale=3.0, size=(5, 7, 11)).astype(np.float32),
    "special": SPECIAL,
    "huge": np.array([3e30, -1e35, 2.0, 0.0], np.float32),
    "largest_binade": np.array([3e38, -3e38, 1.0], np.float32),
    "subnormal_smallest": np.array([1e-40, 1.0, -2e-39], np.float32),
    "zeros": np.zeros((4, 3), np.float32),
    "non_finite_only": np.array([np.inf, np.nan, -np.inf], np.float32),
}


def _host(values, jit: bool = False, multiplier=None) -> tuple[np.ndarray, np.ndarray]:
    measure = jax.jit(statistics.tensor_statistics) if jit else statistics.tensor_statistics
    counts, floats = jax.device_get(measure(values, multiplier))
    return statistics.host_statistics(counts[None], floats[None])


def _assert_matches(measured, values) -> None:
    counts, floats = measured
    expected_counts, expected_floats = reference_statistics(values)
    assert counts.dtype == np.int64 and floats.dtype == np.float64
    np.testing.assert_array_equal(counts, expected_counts)
    np.testing.assert_allclose(floats, expected_floats, rtol=1e-6)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_statistics_match_the_numpy_reference(name, jit):
    _assert_matches(_host(CASES[name], jit), CASES[name])


@pytest.mark.xfail(strict=True, reason="known defect: XLA's CPU reductions flush subnormals")
def test_a_tensor_of_subnormals_only_keeps_its_largest_magnitude_and_sums():
    values = np.array([1e-41, 0.0, 2e-39, -1.4e-45, 1e-38], np.float32)
    _assert_matches(_host(values), values)


def test_one_measurement_is_int32_counts_and_five_float32_values():
    counts, floats = statistics.tensor_statistics(jnp.array([0.5, -3.0, 0.0]))
    assert counts.dtype == jnp.int32 and counts.shape == (statistics.RAW_COUNT_SLOTS,)
    assert floats.dtype == jnp.float32 and floats.shape == (len(statistics.STEP_FLOAT_SLOTS),)
    assert statistics.STEP_FLOAT_SLOTS[-1] == "scale_exponent"
    assert float(floats[4]) == 1.0  # 3.0 lies in [2, 4): the sums are of x / 2


def test_the_counts_are_tensorflows_counts():
    for values in CASES.values():
        jax_counts, _ = _host(values)
        tf_counts, _ = tensorflow_statistics.tensor_statistics(tf.constant(values))
        np.testing.assert_array_equal(jax_counts, tf_counts.numpy())


def test_a_multiplier_is_applied_before_measuring():
    values = np.array([1024.0, -4096.0, 0.0], np.float32)
    _assert_matches(_host(values, multiplier=np.float32(1.0 / 1024.0)), values / 1024.0)


def test_half_precision_arrays_are_measured_in_float32():
    values = np.array([65504.0, -(2.0**-24), 0.5], np.float16)
    _assert_matches(_host(values), values.astype(np.float32))


def test_host_statistics_add_rows_up_and_leave_out_rows_that_measured_nothing():
    first, second = CASES["plain"][0], np.array([[70000.0, -1e-3]], np.float32)
    rows = [statistics.tensor_statistics(part) for part in (first, second)]
    empty = (jnp.zeros(statistics.RAW_COUNT_SLOTS, jnp.int32), jnp.zeros(5, jnp.float32))
    counts = np.stack([jax.device_get(row[0]) for row in [*rows, empty]])
    floats = np.stack([jax.device_get(row[1]) for row in [*rows, empty]])
    measured = statistics.host_statistics(counts, floats)
    _assert_matches(measured, np.concatenate([first.ravel(), second.ravel()]))


def test_empty_totals_are_what_no_rows_add_up_to():
    counts, floats = statistics.empty_totals()
    assert counts.dtype == np.int64 and counts.shape == (statistics.RAW_COUNT_SLOTS,)
    assert counts.sum() == 0 and floats.tolist() == [0.0, np.inf, 0.0, 0.0]
    none = statistics.host_statistics(
        np.zeros((0, statistics.RAW_COUNT_SLOTS)), np.zeros((0, len(statistics.STEP_FLOAT_SLOTS)))
    )
    np.testing.assert_array_equal(none[0], counts)
    assert none[1].tolist() == floats.tolist()


def test_host_totals_combine_by_sum_max_and_min():
    first, second = CASES["plain"], CASES["special"]
    combined = statistics.combine_totals([_host(first), _host(second), statistics.empty_totals()])
    _assert_matches(combined, np.concatenate([first.ravel(), second]))
