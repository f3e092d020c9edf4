"""Tests for autoprec._backends.tensorflow: accumulators, probes and the step hooks on TensorFlow.

The values each probe records are checked against the NumPy reference
(`statistics_reference`) of what `tf.GradientTape` computes for the same
model and batches. The profiler on top of these hooks is tested in
`tests/profiler/test_probes.py` and `test_stats.py`.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from backends.statistics_reference import SPECIAL, reference_statistics

from autoprec._backends import PROFILER_UNSUPPORTED, instrument_backend
from autoprec._backends import tensorflow as tf_backend
from autoprec._core.models import rebuild_train_function


def _assert_matches(measured, values, rtol: float = 1e-6) -> None:
    counts, floats = measured
    expected_counts, expected_floats = reference_statistics(values)
    np.testing.assert_array_equal(counts, expected_counts)
    np.testing.assert_allclose(floats, expected_floats, rtol=rtol)


def test_the_profiler_backend_on_tensorflow_is_this_module():
    assert instrument_backend("autoprec profiling", PROFILER_UNSUPPORTED) is tf_backend
    hooks = tf_backend.ProbeHooks(xla=False)
    assert hooks.tensor_count == 0 and hooks.steps_recorded() == 0 and hooks.read() == {}


def test_variable_names_keep_safe_characters_only():
    assert tf_backend.variable_name("block/dense 1", "tensor") == "block_dense_1"
    assert tf_backend.variable_name("x" * 200, "tensor") == "x" * 120
    assert tf_backend.variable_name("", "tensor") == "tensor"


def test_an_accumulator_adds_up_its_updates():
    accumulator = tf_backend.TensorAccumulator("layer/output")
    assert accumulator.counts.name.startswith("autoprec_counts_layer_output")
    first, second = SPECIAL[:9], np.array([[5.0, -7.0], [1e-3, 0.0]], np.float32)
    accumulator.update(tf.constant(first), xla=False)
    accumulator.update(tf.constant(second), xla=False)
    _assert_matches(accumulator.read(), np.concatenate([first, second.ravel()]))


def test_an_accumulator_reads_as_empty_before_any_update():
    counts, floats = tf_backend.TensorAccumulator("never").read()
    assert counts.sum() == 0 and floats.tolist() == [0.0, np.inf, 0.0, 0.0]


def test_the_cache_measures_a_tensor_once_and_follows_aliases():
    cache = tf_backend.StatisticsCache()
    found = {}

    @tf.function
    def traced(tensor):
        doubled = tensor * 2.0
        first = cache.statistics(doubled, False, None)
        found["again"] = cache.statistics(doubled, False, None) is first
        alias = tf.identity(doubled)
        cache.alias(alias, doubled)
        found["alias"] = cache.statistics(alias, False, None) is first
        found["scaled"] = cache.statistics(doubled, False, tf.constant(0.5)) is first
        return first

    counts, floats = traced(tf.constant([1.0, -3.0]))
    assert found == {"again": True, "alias": True, "scaled": False}
    _assert_matches((counts.numpy(), floats.numpy()), np.array([2.0, -6.0], np.float32))


def test_a_probe_records_a_value_and_its_unscaled_gradient_and_passes_both_on():
    forward = tf_backend.TensorAccumulator("forward")
    backward = tf_backend.TensorAccumulator("backward")
    values = tf.constant([[0.5, -2.0], [3.0, 0.0]])
    with tf.GradientTape() as tape:
        tape.watch(values)
        observed = tf_backend.probe(
            values, forward, backward, xla=False, gradient_multiplier=tf.constant(0.25)
        )
        loss = tf.reduce_sum(observed * observed)  # gradient 2x
    gradient = tape.gradient(loss, values)
    np.testing.assert_array_equal(observed.numpy(), values.numpy())
    np.testing.assert_array_equal(gradient.numpy(), 2.0 * values.numpy())
    _assert_matches(forward.read(), values.numpy())
    _assert_matches(backward.read(), 0.25 * 2.0 * values.numpy())


def test_record_takes_the_values_of_indexed_slices():
    accumulator = tf_backend.TensorAccumulator("embedding/gradient")
    values = tf.constant([[1.0, -4.0], [0.5, 0.0]])
    sparse = tf.IndexedSlices(values, tf.constant([3, 7]), tf.constant([10, 2]))
    tf_backend.record(accumulator, sparse, xla=False, multiplier=tf.constant(2.0))
    _assert_matches(accumulator.read(), 2.0 * values.numpy())


def test_the_step_counter_counts_each_traced_call():
    counter = tf_backend.StepCounter()

    @tf.function
    def step(batch):
        counter.increment(batch)
        return batch + 1.0

    for _ in range(3):
        step(tf.constant([1.0]))
    assert counter.read() == 3


def test_the_inverse_loss_scale_is_read_only_under_loss_scaling():
    assert tf_backend.inverse_loss_scale(keras.optimizers.SGD()) is None
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=256.0)
    optimizer.build([keras.Variable(np.zeros(2, "float32"))])
    assert float(tf_backend.inverse_loss_scale(optimizer)) == 1.0 / 256.0
    factor = keras.optimizers.SGD(loss_scale_factor=8.0)
    assert float(tf_backend.inverse_loss_scale(factor)) == 0.125


def test_float_tensors_are_told_apart():
    assert tf_backend.is_float_tensor(tf.constant([1.0], tf.float16))
    assert not tf_backend.is_float_tensor(tf.constant([1], tf.int32))
    assert not tf_backend.is_float_tensor(np.ones(2, "float32"))


def test_the_xla_check_answers_once_per_process():
    answer = tf_backend.xla_can_host_probes()
    assert isinstance(answer, bool) and tf_backend.xla_can_host_probes() is answer


# -- the hooks inside a real fit -------------------------------------------------------------

ACTIVATION = ("probed", "activations", "output")
ACTIVATION_GRADIENT = ("probed", "activation_gradients", "output")


class Probed(keras.layers.Layer):
    """A Dense layer whose output goes through the hooks' probe while a step is traced."""

    hooks = None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(3)

    def call(self, inputs):
        outputs = self.dense(inputs)
        if Probed.hooks is not None and Probed.hooks.recording:
            outputs = Probed.hooks.probe(outputs, ACTIVATION, ACTIVATION_GRADIENT)
        return outputs


def _expected(model, x, y, batch: int) -> dict[tuple[str, str, str], np.ndarray]:
    """Every value the hooks should record, computed with `tf.GradientTape`, all steps joined."""
    probed, out = model.get_layer("probed"), model.get_layer("out")
    found = {ACTIVATION: [], ACTIVATION_GRADIENT: [], ("out", "weight_gradients", "kernel"): []}
    for start in range(0, len(x), batch):
        inputs, targets = x[start : start + batch], y[start : start + batch]
        with tf.GradientTape() as tape:
            hidden = probed.dense(inputs)
            tape.watch(hidden)
            loss = tf.reduce_mean(tf.square(out(hidden) - targets))
        hidden_gradient, kernel_gradient = tape.gradient(loss, [hidden, out.kernel])
        found[ACTIVATION].append(hidden.numpy())
        found[ACTIVATION_GRADIENT].append(hidden_gradient.numpy())
        found[("out", "weight_gradients", "kernel")].append(kernel_gradient.numpy())
    steps = len(x) // batch
    found[("out", "weights", "kernel")] = [out.kernel.numpy()] * steps
    return {slot: np.concatenate([v.ravel() for v in values]) for slot, values in found.items()}


@pytest.fixture
def probed_fit():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(12, 4)).astype("float32"), rng.normal(size=(12, 1)).astype("float32")
    model = keras.Sequential(
        [keras.Input((4,)), Probed(name="probed"), keras.layers.Dense(1, name="out")]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    hooks = tf_backend.ProbeHooks(xla=False)
    replaced = []

    def replace(owner, name, value):
        replaced.append((owner, name))
        setattr(owner, name, value)

    Probed.hooks = hooks
    try:
        hooks.install_step(model, {id(model.get_layer("out").kernel): ("out", "kernel")}, replace)
        rebuild_train_function(model)
        model.fit(x, y, batch_size=4, shuffle=False, verbose=0)
    finally:
        Probed.hooks = None
    return model, hooks, replaced, _expected(model, x, y, batch=4)


def test_the_hooks_wrap_the_train_step_and_apply_gradients_only(probed_fit):
    model, hooks, replaced, _ = probed_fit
    assert replaced == [(model, "train_step"), (model.optimizer, "apply_gradients")]
    assert not hooks.recording  # only while a step is traced
    assert hooks.steps_recorded() == 3
    assert hooks.tensor_count == 4  # the probe's two slots, the kernel and its gradient


def test_the_hooks_record_what_the_gradient_tape_computes(probed_fit):
    _, hooks, _, expected = probed_fit
    recorded = hooks.read()
    assert set(recorded) == set(expected)
    for slot, values in expected.items():
        _assert_matches(recorded[slot], values, rtol=1e-5)
