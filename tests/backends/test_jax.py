"""Tests for autoprec._backends.jax: the profiler's step hooks inside Keras' pure JAX train step,
and the compiled steps calibration times.

The hooks run in one child process under Keras' JAX backend
(`jax_child.run_jax_child`), with TensorFlow made unimportable. There a real
layer hands its output and its input to the hooks (as
`autoprec.profiler.ProbeSession` does), a real `fit` runs, and the child
prints what the hooks read beside the values `jax.grad` computes for the same
weights and batches; the tests compare them with `statistics_reference`.
The whole profiler on JAX is tested in `tests/profiler/test_jax_profile.py`.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from backends.jax_child import run_jax_child
from backends.statistics_reference import reference_statistics

pytest.importorskip("jax")

CHILD = textwrap.dedent(
    """
    import json, sys
    sys.modules["tensorflow"] = None  # as on a machine with JAX and no TensorFlow
    import jax, jax.numpy as jnp, keras, numpy as np
    import autoprec
    from autoprec._backends import PROFILER_UNSUPPORTED, instrument_backend
    from autoprec._backends import jax as jax_probes
    from autoprec._core.models import rebuild_train_function

    INTERNAL = ("probed", "internals", "inputs")
    ACTIVATION = ("probed", "activations", "output")
    GRADIENT = ("probed", "activation_gradients", "output")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(12, 4)).astype("float32"), rng.normal(size=(12, 1)).astype("float32")

    class Probed(keras.layers.Layer):
        hooks, recording_calls, flaky = None, 0, False

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense = keras.layers.Dense(3)

        def call(self, inputs):
            hooks = Probed.hooks
            recording = hooks is not None and hooks.recording
            Probed.recording_calls += recording
            if recording and not Probed.flaky:
                hooks.record(INTERNAL, inputs)
            outputs = self.dense(inputs)
            if recording and (not Probed.flaky or Probed.recording_calls > 1):
                outputs = hooks.probe(outputs, ACTIVATION, GRADIENT)
            return outputs

    def probed_fit(optimizer, steps_per_execution=1, flaky=False):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), Probed(name="probed"),
                                  keras.layers.Dense(1, name="out")])
        model.compile(optimizer=optimizer, loss="mse", steps_per_execution=steps_per_execution)
        hooks, replaced = jax_probes.ProbeHooks(), []

        def replace(owner, name, value):
            replaced.append([type(owner).__name__, name])
            setattr(owner, name, value)

        hooks.install_step(model, {id(model.get_layer("out").kernel): ("out", "kernel")}, replace)
        rebuild_train_function(model)
        Probed.hooks, Probed.recording_calls, Probed.flaky = hooks, 0, flaky
        try:
            history = model.fit(x, y, batch_size=4, shuffle=False, verbose=0)
        finally:
            Probed.hooks = None
        read = {"/".join(slot): [c.tolist(), f.tolist()] for slot, (c, f) in hooks.read().items()}
        return model, hooks, replaced, history, read

    def expected(model):
        probed, out = model.get_layer("probed").dense, model.get_layer("out")
        kernel, bias = probed.kernel.numpy(), probed.bias.numpy()
        weights, offset = out.kernel.numpy(), out.bias.numpy()
        found = {"probed/internals/inputs": [], "probed/activations/output": [],
                 "probed/activation_gradients/output": [], "out/weight_gradients/kernel": [],
                 "out/weights/kernel": []}
        for start in range(0, 12, 4):
            inputs, targets = x[start:start + 4], y[start:start + 4]
            hidden = inputs @ kernel + bias
            loss = lambda h, w: jnp.mean((h @ w + offset - targets) ** 2)
            into_hidden, into_weights = jax.grad(loss, argnums=(0, 1))(hidden, weights)
            for slot, value in zip(found, [inputs, hidden, into_hidden, into_weights, weights]):
                found[slot] += np.asarray(value, "float32").ravel().tolist()
        return found

    model, hooks, replaced, history, read = probed_fit(keras.optimizers.SGD(0.0))
    results = {
        "dispatch": instrument_backend("autoprec profiling", PROFILER_UNSUPPORTED) is jax_probes,
        "replaced": replaced,
        "logs": sorted(history.history),
        "steps": hooks.steps_recorded(),
        "tensor_count": hooks.tensor_count,
        "recording_after": hooks.recording,
        "read": read,
        "expected": expected(model),
        "float": [jax_probes.is_float_tensor(jnp.ones(2, "float16")),
                  jax_probes.is_float_tensor(jnp.ones(2, "int32")),
                  jax_probes.is_float_tensor(np.ones(2, "float32"))],
        "xla": jax_probes.xla_can_host_probes(),
    }
    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.0), initial_scale=1024.0)
    results["scaled"] = probed_fit(scaled)[4]
    _, hooks, _, _, results["per_execution"] = probed_fit(keras.optimizers.SGD(0.0), 2)
    results["per_execution_steps"] = hooks.steps_recorded()
    try:
        probed_fit(keras.optimizers.SGD(0.0), flaky=True)
        results["flaky"] = "no error"
    except autoprec.ProfileError as error:
        results["flaky"] = str(error)
    print("RESULT " + json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def results():
    # Optimisation level 0 keeps the child's compile time (most of its run time) down.
    return run_jax_child(CHILD, xla_flags="--xla_backend_optimization_level=0")


def _assert_matches(recorded, values, rtol: float = 1e-5) -> None:
    counts, floats = (np.asarray(part) for part in recorded)
    expected_counts, expected_floats = reference_statistics(np.asarray(values, np.float32))
    np.testing.assert_array_equal(counts, expected_counts)
    np.testing.assert_allclose(floats, expected_floats, rtol=rtol)


def test_the_profiler_backend_on_jax_is_this_module(results):
    assert results["dispatch"]
    assert results["xla"] is True
    assert results["float"] == [True, False, False]


def test_the_hooks_wrap_the_step_the_loss_the_train_function_and_stateless_apply(results):
    assert results["replaced"] == [
        ["Sequential", "train_step"],
        ["Sequential", "compute_loss_and_updates"],
        ["Sequential", "make_train_function"],
        ["SGD", "stateless_apply"],
    ]
    assert results["recording_after"] is False


def test_every_step_is_recorded_and_its_statistics_leave_the_logs(results):
    assert results["steps"] == 3
    assert results["logs"] == ["loss"]  # the statistics' logs key is taken out before fit
    assert results["tensor_count"] == 5  # an internal, the probe's two slots, kernel, gradient


def test_every_slot_records_what_jax_grad_computes(results):
    recorded, expected = results["read"], results["expected"]
    assert set(recorded) == set(expected)
    for slot, values in expected.items():
        _assert_matches(recorded[slot], values)


def test_loss_scaled_gradients_are_recorded_unscaled(results):
    for slot, values in results["expected"].items():
        _assert_matches(results["scaled"][slot], values)


def test_with_several_steps_per_execution_every_step_is_recorded(results):
    assert results["per_execution_steps"] == 3
    for slot, values in results["expected"].items():
        _assert_matches(results["per_execution"][slot], values)


def test_a_forward_pass_that_probes_differently_when_traced_again_is_refused(results):
    message = results["flaky"]
    assert "abstract pass probed no more probes" in message and "trace the same way" in message


pytest.importorskip("jax")

TIMING_CHILD = textwrap.dedent(
    """
    import json, sys
    sys.modules["tensorflow"] = None
    import jax, keras, numpy as np
    from autoprec._backends import jax as jax_timing, timing_backend

    dense = keras.layers.Dense(4, dtype="mixed_bfloat16")
    outputs, gradients, state = jax_timing.layer_step(
        dense, [keras.ops.ones((2, 8), dtype="bfloat16")], {}
    )()
    norm = keras.layers.BatchNormalization()
    _, _, updated = jax_timing.layer_step(norm, [keras.ops.ones((4, 3))], {})()
    draw = jax_timing.random_tensor((3, 2), "float16", np.random.default_rng(0))
    again = jax_timing.random_tensor((3, 2), "float16", np.random.default_rng(0))
    there, back = jax_timing.cast_step("bfloat16", 64)()
    print("RESULT " + json.dumps({
        "dispatch": timing_backend("calibrate()") is jax_timing,
        "versions": jax_timing.versions() == {"jax": jax.__version__},
        "output_dtype": str(outputs[0].dtype),
        "kernel_gradient_dtype": str(gradients[0][0].dtype),
        "input_gradient_shape": list(gradients[1][0].shape),
        "moving_statistics_updated": len(updated),
        "draw": [str(draw.dtype), bool(np.array_equal(np.asarray(draw), np.asarray(again)))],
        "empty": float(jax_timing.empty_step()()),
        "cast": [str(there.dtype), str(back.dtype)],
        "on_device": type(jax_timing.to_device(np.ones(2))).__name__,
    }))
    """
)


@pytest.fixture(scope="module")
def timing_results():
    return run_jax_child(TIMING_CHILD)


def test_the_timing_backend_on_jax_is_this_module(timing_results):
    assert timing_results["dispatch"] and timing_results["versions"]


def test_a_mixed_layer_step_computes_in_bfloat16_with_float32_kernel_gradients(timing_results):
    assert timing_results["output_dtype"] == "bfloat16"
    assert timing_results["kernel_gradient_dtype"] == "float32"
    assert timing_results["input_gradient_shape"] == [2, 8]


def test_a_layer_steps_updated_state_is_returned(timing_results):
    assert timing_results["moving_statistics_updated"] == 2  # BatchNormalization's moving mean, var


def test_draws_casts_and_dispatch(timing_results):
    assert timing_results["draw"] == ["float16", True]
    assert timing_results["empty"] == 2.0
    assert timing_results["cast"] == ["bfloat16", "float32"]
    assert timing_results["on_device"] == "ArrayImpl"
