"""Tests for autoprec._backends.jax_probes: measurements leaving a differentiated JAX function as sink gradients.

The sinks need JAX only, so a train step's differentiated loss function is
written here with `jax.value_and_grad` as Keras' JAX trainer calls it: an
abstract pass lists the probes, the real pass differentiates the sinks beside
the weights, and the sinks' gradients decode to the statistics of the values
and gradients the probes saw, checked against `statistics_reference`.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from backends.statistics_reference import SPECIAL, reference_statistics

from autoprec._backends import instrument
from autoprec._backends import tensorflow as tf_backend
from autoprec.errors import ProfileError

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
probes = pytest.importorskip("autoprec._backends.jax_probes")

ACTIVATION = ("dense", "activations", "output")
GRADIENT = ("dense", "activation_gradients", "output")
WEIGHT_GRADIENT = ("dense", "weight_gradients", "kernel")


def _assert_rows_match(rows, values, rtol: float = 1e-6) -> None:
    _assert_matches(probes.host_statistics(*jax.device_get(rows)), values, rtol)


def test_a_measurement_survives_encoding_bit_for_bit():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 2**31 - 1, probes.RAW_COUNT_SLOTS).astype(np.int32)
    floats = np.array([3e38, 1.4e-45, np.inf, np.nan, -7.0], np.float32)
    encoded = probes.encode(jnp.asarray(counts), jnp.asarray(floats))
    assert encoded.shape == (probes.SINK_SIZE,) and encoded.dtype == jnp.float32
    digits = np.asarray(encoded)
    assert np.array_equal(digits, np.round(digits)) and digits.min() >= 0 and digits.max() <= 255
    decoded_counts, decoded_floats = jax.device_get(probes.decode(encoded))
    np.testing.assert_array_equal(decoded_counts, counts)
    assert decoded_floats.view(np.uint32).tolist() == floats.view(np.uint32).tolist()


def test_a_sink_no_gradient_reached_decodes_to_a_row_that_measured_nothing():
    counts, floats = probes.decode(jnp.zeros((probes.SINK_SIZE,), jnp.float32))
    assert int(counts.sum()) == 0 and float(jnp.abs(floats).sum()) == 0.0


def test_observe_passes_value_and_gradient_on_and_measures_the_scaled_gradient():
    value = jnp.asarray(SPECIAL[5:9])
    sink = jnp.zeros((probes.SINK_SIZE,), jnp.float32)

    def loss(value, sink, multiplier):
        return jnp.sum(3.0 * probes.observe(value, sink, multiplier))

    observed = probes.observe(value, sink, jnp.float32(0.25))
    assert np.array_equal(np.asarray(observed), np.asarray(value))
    into_value, into_sink, into_multiplier = jax.grad(loss, argnums=(0, 1, 2))(
        value, sink, jnp.float32(0.25)
    )
    assert np.asarray(into_value).tolist() == [3.0] * 4
    assert float(into_multiplier) == 0.0
    _assert_rows_match(probes.decode(into_sink), np.full(4, 0.75, np.float32))


def _forward(trace, weights, inputs):
    """A one-layer model's loss with its probes: the output and the gradient flowing into it."""
    hidden = inputs @ weights
    trace.record(ACTIVATION, hidden)
    hidden = trace.observe_gradient(GRADIENT, hidden)
    return jnp.sum(hidden * hidden)


@pytest.fixture
def step():
    """One probed step: abstract pass, differentiated real pass, sinks taken off the gradients."""
    rng = np.random.default_rng(1)
    weights = jnp.asarray(rng.normal(size=(4, 3)).astype(np.float32))
    inputs = jnp.asarray(rng.normal(size=(5, 4)).astype(np.float32))
    discovery = probes.StepTrace(discovering=True, multiplier=None, in_loss=True)
    jax.eval_shape(lambda w, x: _forward(discovery, w, x), weights, inputs)
    trace = probes.StepTrace(
        discovering=False,
        multiplier=jnp.float32(0.5),
        forward_sites=discovery.forward_sites,
        backward_sites=discovery.backward_sites,
        trainable_count=1,
    )
    carrier = jnp.zeros((2,), jnp.float32)  # another wrapper's entry, which stays last
    trainable = trace.with_sinks([weights, carrier])

    def loss_function(trainable):
        own = trace.take_sinks(list(trainable))
        trace.in_loss = True
        loss = _forward(trace, own[0], inputs)
        trace.in_loss = False
        return trace.add_loss_terms(loss)

    loss, grads = jax.value_and_grad(loss_function)(trainable)
    grads, kept = trace.take_sink_gradients(list(grads), list(trainable))
    trace.measure(WEIGHT_GRADIENT, grads[0], trace.multiplier)
    return {
        "discovery": discovery,
        "trainable": trainable,
        "loss": loss,
        "grads": grads,
        "kept": kept,
        "statistics": trace.statistics(),
        "plain": jax.value_and_grad(lambda w: jnp.sum((inputs @ w) ** 2))(weights),
        "hidden": np.asarray(inputs @ weights),
    }


def test_the_abstract_pass_lists_the_probes_in_call_order(step):
    discovery = step["discovery"]
    assert discovery.forward_sites == [ACTIVATION] and discovery.backward_sites == [GRADIENT]
    assert discovery.direct == [] and discovery.loss_terms == []  # nothing measured


def test_the_sinks_sit_after_the_models_values_and_are_taken_off_again(step):
    trainable, kept, grads = step["trainable"], step["kept"], step["grads"]
    sink = (probes.SINK_SIZE,)
    assert [value.shape for value in trainable] == [(4, 3), sink, sink, (2,)]
    assert [value.shape for value in kept] == [(4, 3), (2,)]
    assert [value.shape for value in grads] == [(4, 3), (2,)]


def test_the_loss_and_the_weight_gradient_are_those_of_the_unprobed_step(step):
    plain_loss, plain_gradient = step["plain"]
    assert float(step["loss"]) == float(plain_loss)  # the sinks add an exact 0.0
    np.testing.assert_array_equal(np.asarray(step["grads"][0]), np.asarray(plain_gradient))


def test_each_probe_decodes_to_what_it_saw(step):
    found = step["statistics"]
    assert set(found) == {ACTIVATION, GRADIENT, WEIGHT_GRADIENT}
    hidden = step["hidden"]
    _assert_rows_match(found[ACTIVATION], hidden)
    _assert_rows_match(found[GRADIENT], 0.5 * 2.0 * hidden, rtol=1e-5)  # scaled by the multiplier
    _assert_rows_match(found[WEIGHT_GRADIENT], 0.5 * np.asarray(step["plain"][1]), rtol=1e-5)


def test_a_forward_value_outside_the_loss_function_is_measured_directly():
    trace = probes.StepTrace(discovering=False, multiplier=None)
    values = SPECIAL[:6]
    trace.record(ACTIVATION, jnp.asarray(values))
    assert trace.observe_gradient(GRADIENT, jnp.asarray(values)) is not None
    assert trace.sink_count == 0 and trace.backward_used == 0
    _assert_rows_match(trace.statistics()[ACTIVATION], values)


def test_a_probe_the_abstract_pass_did_not_see_is_refused():
    trace = probes.StepTrace(
        discovering=False, multiplier=None, forward_sites=[ACTIVATION], in_loss=True
    )
    trace.take_sinks([jnp.zeros((probes.SINK_SIZE,), jnp.float32)])
    with pytest.raises(ProfileError, match="trace the same way"):
        trace.record(("other", "activations", "output"), jnp.ones(3))


def test_fewer_trainable_values_than_sinks_are_refused():
    trace = probes.StepTrace(
        discovering=False, multiplier=None, forward_sites=[ACTIVATION], trainable_count=1
    )
    with pytest.raises(ProfileError, match="fewer than the 2"):
        trace.take_sinks([jnp.ones(3)])


def test_a_step_that_used_fewer_probes_or_lost_the_sink_gradients_is_refused():
    unused = probes.StepTrace(discovering=False, multiplier=None, forward_sites=[ACTIVATION])
    with pytest.raises(ProfileError, match="fewer tensors than its abstract pass"):
        unused.statistics()
    lost = probes.StepTrace(
        discovering=False, multiplier=None, forward_sites=[ACTIVATION], in_loss=True
    )
    lost.take_sinks([jnp.zeros((probes.SINK_SIZE,), jnp.float32)])
    lost.record(ACTIVATION, jnp.ones(3))
    with pytest.raises(ProfileError, match="did not receive the gradients"):
        lost.statistics()


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
    measure = jax.jit(probes.tensor_statistics) if jit else probes.tensor_statistics
    counts, floats = jax.device_get(measure(values, multiplier))
    return probes.host_statistics(counts[None], floats[None])


def _assert_matches(measured, values, rtol: float = 1e-6) -> None:
    counts, floats = measured
    expected_counts, expected_floats = reference_statistics(values)
    assert counts.dtype == np.int64 and floats.dtype == np.float64
    np.testing.assert_array_equal(counts, expected_counts)
    np.testing.assert_allclose(floats, expected_floats, rtol=rtol)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_statistics_match_the_numpy_reference(name, jit):
    _assert_matches(_host(CASES[name], jit), CASES[name])


@pytest.mark.xfail(strict=True, reason="known defect: XLA's CPU reductions flush subnormals")
def test_a_tensor_of_subnormals_only_keeps_its_largest_magnitude_and_sums():
    values = np.array([1e-41, 0.0, 2e-39, -1.4e-45, 1e-38], np.float32)
    _assert_matches(_host(values), values)


def test_one_measurement_is_int32_counts_and_five_float32_values():
    counts, floats = probes.tensor_statistics(jnp.array([0.5, -3.0, 0.0]))
    assert counts.dtype == jnp.int32 and counts.shape == (probes.RAW_COUNT_SLOTS,)
    assert floats.dtype == jnp.float32 and floats.shape == (len(probes.STEP_FLOAT_SLOTS),)
    assert probes.STEP_FLOAT_SLOTS[-1] == "scale_exponent"
    assert float(floats[4]) == 1.0  # 3.0 lies in [2, 4): the sums are of x / 2


def test_the_counts_are_tensorflows_counts():
    for values in CASES.values():
        jax_counts, _ = _host(values)
        tf_counts, _ = tf_backend.tensor_statistics(tf.constant(values))
        np.testing.assert_array_equal(jax_counts, tf_counts.numpy())


def test_a_multiplier_is_applied_before_measuring():
    values = np.array([1024.0, -4096.0, 0.0], np.float32)
    _assert_matches(_host(values, multiplier=np.float32(1.0 / 1024.0)), values / 1024.0)


def test_half_precision_arrays_are_measured_in_float32():
    values = np.array([65504.0, -(2.0**-24), 0.5], np.float16)
    _assert_matches(_host(values), values.astype(np.float32))


def test_host_statistics_add_rows_up_and_leave_out_rows_that_measured_nothing():
    first, second = CASES["plain"][0], np.array([[70000.0, -1e-3]], np.float32)
    rows = [probes.tensor_statistics(part) for part in (first, second)]
    empty = (jnp.zeros(probes.RAW_COUNT_SLOTS, jnp.int32), jnp.zeros(5, jnp.float32))
    counts = np.stack([jax.device_get(row[0]) for row in [*rows, empty]])
    floats = np.stack([jax.device_get(row[1]) for row in [*rows, empty]])
    measured = probes.host_statistics(counts, floats)
    _assert_matches(measured, np.concatenate([first.ravel(), second.ravel()]))


def test_empty_totals_are_what_no_rows_add_up_to():
    counts, floats = instrument.empty_totals()
    assert counts.dtype == np.int64 and counts.shape == (probes.RAW_COUNT_SLOTS,)
    assert counts.sum() == 0 and floats.tolist() == [0.0, np.inf, 0.0, 0.0]
    none = probes.host_statistics(
        np.zeros((0, probes.RAW_COUNT_SLOTS)), np.zeros((0, len(probes.STEP_FLOAT_SLOTS)))
    )
    np.testing.assert_array_equal(none[0], counts)
    assert none[1].tolist() == floats.tolist()


def test_host_totals_combine_by_sum_max_and_min():
    first, second = CASES["plain"], CASES["special"]
    combined = instrument.combine_totals([_host(first), _host(second), instrument.empty_totals()])
    _assert_matches(combined, np.concatenate([first.ravel(), second]))
