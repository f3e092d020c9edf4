"""Tests for autoprec._backends.tensorflow: one tensor's raw statistics, accumulators, probes and
the step hooks, TensorBoard event files and the compiled steps calibration times.

The values each probe records are checked against the NumPy reference
(`statistics_reference`) of what `tf.GradientTape` computes for the same
model and batches. The profiler on top of these hooks is tested in
`tests/profiler/test_runner.py` and `test_stats.py`.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from backends.statistics_reference import SPECIAL, reference_statistics
from tensorflow.core.util import event_pb2

from autoprec._backends import PROFILER_UNSUPPORTED, instrument, instrument_backend, timing_backend
from autoprec._backends import tensorflow as tf_backend
from autoprec._core.models import rebuild_train_function


def _assert_matches(measured, values, rtol: float = 1e-6) -> None:
    counts, floats = measured
    expected_counts, expected_floats = reference_statistics(values)
    assert counts.dtype == np.int64 and floats.dtype == np.float64
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
    accumulator.update(sparse, xla=False, multiplier=tf.constant(2.0))
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


def _measured(values, xla: bool = False, multiplier=None) -> tuple[np.ndarray, np.ndarray]:
    counts, floats = tf_backend.tensor_statistics(tf.constant(values), xla, multiplier)
    return counts.numpy(), floats.numpy()


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
    _assert_matches(_measured(values, xla), values)


@pytest.mark.parametrize("xla", [False, True], ids=["graph_ops", "xla_ops"])
@pytest.mark.parametrize("values", [SPECIAL, *DEFECTS.values()], ids=["special", *DEFECTS])
def test_counts_are_exact_for_subnormals_and_the_largest_magnitudes(values, xla):
    counts, _ = _measured(values, xla)
    np.testing.assert_array_equal(counts, reference_statistics(values)[0])


@pytest.mark.xfail(strict=True, reason="known defect: subnormals flushed to zero (see DEFECTS)")
@pytest.mark.parametrize("name", sorted(DEFECTS))
def test_floats_of_subnormals_and_the_largest_magnitudes(name):
    values = DEFECTS[name]
    _assert_matches(_measured(values), values)


def test_the_count_layout_is_the_documented_one():
    assert instrument.RAW_COUNT_SLOTS == 256 + 23 + 1
    assert instrument.FLOAT_SLOTS == ("max_abs", "min_nonzero_abs", "sum_abs", "sum_squares")
    counts, floats = _measured(np.array([0.0, 1.0, -3.0, np.inf, np.nan, 0.25], np.float32))
    assert counts[0] == 1 and counts[125] == counts[127] == counts[128] == 1
    assert counts[255] == 2 and counts[-1] == 1  # inf and NaN; one of them NaN
    assert floats.tolist() == [3.0, 0.25, 4.25, 10.0625]


def test_half_precision_tensors_are_measured_in_float32():
    values = np.array([65504.0, -(2.0**-24), 0.5], np.float16)
    _assert_matches(_measured(values), values.astype(np.float32))


def test_a_multiplier_is_applied_before_measuring():
    values = np.array([1024.0, -4096.0, 0.0], np.float32)
    measured = _measured(values, multiplier=tf.constant(1.0 / 1024.0))
    _assert_matches(measured, values / 1024.0)


def test_inside_an_xla_compiled_function_the_statistics_are_the_same():
    values = CASES["special_normal"]

    @tf.function(jit_compile=True)
    def compiled(tensor):
        return tf_backend.tensor_statistics(tensor, xla=True)

    counts, floats = compiled(tf.constant(values))
    _assert_matches((counts.numpy(), floats.numpy()), values)


def test_float_slots_combine_by_max_min_and_sum():
    current = tf.constant([2.0, 0.5, 3.0, 5.0], tf.float64)
    new = tf.constant([1.0, 0.25, 1.0, 1.0], tf.float64)
    assert tf_backend.combine_floats(current, new).numpy().tolist() == [2.0, 0.25, 4.0, 6.0]
    start = tf.constant([0.0, np.inf, 0.0, 0.0], tf.float64)  # an accumulator's first value
    assert tf_backend.combine_floats(start, new).numpy().tolist() == new.numpy().tolist()


def _summaries(logdir) -> list[tuple[int, str, str, str, np.ndarray]]:
    """`(step, tag, plugin, description, value)` of every summary value under `logdir`."""
    found = []
    for path in sorted(tf.io.gfile.glob(str(logdir / "events.out.tfevents.*"))):
        for record in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                metadata = value.metadata
                found.append(
                    (
                        event.step,
                        value.tag,
                        metadata.plugin_data.plugin_name,
                        metadata.summary_description,
                        tf.make_ndarray(value.tensor),
                    )
                )
    return found


def _histograms(logdir) -> dict[str, np.ndarray]:
    """`{tag: buckets}` of the histogram summaries under `logdir`."""
    return {tag: value for _, tag, plugin, _, value in _summaries(logdir) if plugin == "histograms"}


def test_histograms_written_are_read_back(tmp_path):
    exponents, counts = np.array([-2, 0, 3]), np.array([1, 5, 2])
    tf_backend.write_histograms(tmp_path, [("layer/output", exponents, counts)], step=1)
    (buckets,) = _histograms(tmp_path).values()
    assert buckets[:, 0].tolist() == [-2, 0, 3] and buckets[:, 1].tolist() == [-1, 1, 4]
    assert buckets[:, 2].tolist() == [1, 5, 2]


def test_histograms_carry_their_step_and_plugin(tmp_path):
    series = [("a/output", np.array([0]), np.array([4])), ("b/output", np.array([7]), [1])]
    tf_backend.write_histograms(tmp_path, series, step=5)
    summaries = _summaries(tmp_path)
    assert [(step, tag, plugin, text) for step, tag, plugin, text, _ in summaries] == [
        (5, "a/output", "histograms", ""),
        (5, "b/output", "histograms", ""),
    ]
    assert sorted(_histograms(tmp_path)) == ["a/output", "b/output"]


def test_the_profilers_tensorflow_module_writes_with_this_writer():
    assert tf_backend.write_histograms is tf_backend.write_histograms


def test_summary_writer_writes_scalars_and_markdown_text(tmp_path):
    writer = tf_backend.SummaryWriter(tmp_path / "guard")
    writer.write(3, {"loss_scale": 1024.0}, {"plan": "**dense**: float16"})
    writer.write(4, {"loss_scale": 512.0}, {})
    writer.close()
    written = {
        (step, tag, plugin): value for step, tag, plugin, _, value in _summaries(tmp_path / "guard")
    }
    assert set(written) == {
        (3, "loss_scale", "scalars"),
        (3, "plan", "text"),
        (4, "loss_scale", "scalars"),
    }
    assert float(written[(3, "loss_scale", "scalars")]) == 1024.0
    assert float(written[(4, "loss_scale", "scalars")]) == 512.0
    assert written[(3, "plan", "text")].item() == b"**dense**: float16"
    assert _histograms(tmp_path / "guard") == {}  # no histogram among them


def test_a_histogram_series_is_what_the_writers_take(tmp_path):
    series = [("dense/output", np.array([-1, 2]), np.array([3, 4]))]
    tf_backend.write_histograms(tmp_path, series, step=2)
    (buckets,) = _histograms(tmp_path).values()
    assert buckets.tolist() == [[-1.0, 0.0, 3.0], [2.0, 3.0, 4.0]]


def test_the_timing_backend_on_tensorflow_is_this_module():
    assert timing_backend("calibrate()") is tf_backend
    assert tf_backend.versions() == {"tensorflow": tf.__version__}


def test_random_tensors_come_from_the_generator_in_the_asked_dtype():
    first = tf_backend.random_tensor((3, 4), "bfloat16", np.random.default_rng(1))
    again = tf_backend.random_tensor((3, 4), "bfloat16", np.random.default_rng(1))
    assert first.dtype == tf.bfloat16 and tuple(first.shape) == (3, 4)
    assert np.array_equal(first.numpy(), again.numpy())
    batch = np.ones((2, 2), "float32")
    assert tf_backend.to_device(batch) is batch


def test_layer_step_runs_a_forward_and_backward_pass_of_a_mixed_layer():
    layer = keras.layers.Dense(4, dtype="mixed_float16")
    inputs = tf.ones((2, 8), tf.float16)
    step = tf_backend.layer_step(layer, [inputs], {}, jit_compile=False)
    assert np.isfinite(step())
    assert layer.built and layer.kernel.dtype == "float32"


def test_empty_and_cast_steps_return_finite_values():
    assert float(tf_backend.empty_step()()) == 2.0
    assert np.isfinite(float(tf_backend.cast_step("float16", 1024)()))
