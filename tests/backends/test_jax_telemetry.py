"""Tests for autoprec._backends.jax: the telemetry's host-side state and hooks on JAX.

The checks run in one child process under Keras' JAX backend
(`jax_child.run_jax_child`), with TensorFlow made unimportable.
"""

from __future__ import annotations

import textwrap

import pytest
from backends.jax_child import run_jax_child

pytest.importorskip("jax")

CHILD = textwrap.dedent(
    """
    import json, sys
    sys.modules["tensorflow"] = None
    import jax.numpy as jnp, keras, numpy as np
    import autoprec
    from autoprec._backends import instrument_backend
    from autoprec._backends import jax as jax_telemetry
    from autoprec._backends.instrument import bit_view
    from autoprec.runtime import apply_plan
    from autoprec.runtime.telemetry import GuardTelemetry

    empty = jax_telemetry.TelemetryHooks(np.full((4, 2, 4), -1.0, np.float32))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="wide"),
                              keras.layers.Dense(1, name="out")])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32")
    handle = apply_plan(model, plan)
    model.optimizer = autoprec.FlooredLossScaleOptimizer(model.optimizer, initial_scale=8.0)
    model.optimizer.build(model.trainable_variables)
    telemetry = GuardTelemetry(model, handle.dtypes)
    telemetry.install()
    model.make_train_function(force=True)
    x = np.ones((12, 4), "float32")
    x[8:] = np.nan  # the third step's batch is non-finite
    model.fit(x, np.zeros((12, 1), "float32"), batch_size=4, shuffle=False, verbose=0)
    hooks = telemetry.hooks
    history = hooks.read_history()
    status = hooks.read_status().tolist()
    hooks.clear_status()
    # Activation gradients through the carrier: a layer called twice gets the larger of its
    # two incoming gradients' amax (not their sum), checked against jax.grad in float32.
    import jax
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    shared = keras.layers.Dense(4, use_bias=False, name="shared")
    outputs = keras.layers.Dense(1, name="out")(shared(shared(inputs)))
    twice = keras.Model(inputs, outputs)
    twice.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    twice.get_layer("shared").set_weights([np.full((4, 4), 0.5, "float32")])
    twice.get_layer("out").set_weights([np.ones((4, 1), "float32"), np.zeros(1, "float32")])
    handle = apply_plan(twice, autoprec.PrecisionPlan.uniform(twice, "float16")
                        .with_dtype("out", "float32"))
    twice.optimizer = autoprec.FlooredLossScaleOptimizer(twice.optimizer, initial_scale=8.0)
    twice.optimizer.build(twice.trainable_variables)
    carried = GuardTelemetry(twice, handle.dtypes)
    carried.install()
    twice.make_train_function(force=True)
    x_small, y_one = np.full((4, 4), 1e-3, "float32"), np.ones((4, 1), "float32")
    twice.fit(x_small, y_one, batch_size=4, verbose=0)
    kernel = np.full((4, 4), 0.5, "float32")
    first_call = x_small @ kernel
    def scaled_loss(h1, h2):
        return 8.0 * jnp.mean(((h2 @ np.ones((4, 1), "float32")) - y_one) ** 2)
    def from_first(h1):
        return scaled_loss(h1, h1 @ kernel)
    upstream = [float(jnp.abs(jax.grad(from_first)(first_call)).max()),
                float(jnp.abs(jax.grad(lambda h2: scaled_loss(None, h2))(first_call @ kernel)).max())]
    shared_record = carried.read_records()[-1].layers["shared"]

    print("RESULT " + json.dumps({
        "carrier": [shared_record.gradient, upstream],
        "dispatch": instrument_backend() is jax_telemetry,
        "lazy": empty.measures_bfloat16_lazily,
        "integer": empty.integer_amax_is_fast(False),
        "empty": [empty.read_count(), empty.read_status().tolist()],
        "bitcast": int(bit_view(jnp.float32(1.0), "int32")),
        "count": hooks.read_count(),
        "scale": float(history[-3, 0, 0]),
        "batch": [float(history[-2, 0, 1]), bool(np.isnan(history[-1, 0, 1]))],
        "wide": [float(value) for value in history[-2, 1]],
        "status": [status, hooks.read_status().tolist()],
    }))
    """
)


@pytest.fixture(scope="module")
def results():
    return run_jax_child(CHILD)


def test_the_telemetry_backend_on_jax_is_this_module(results):
    assert results["dispatch"]
    assert results["lazy"] is False and results["integer"] is True
    assert results["empty"] == [0, [0, 0]]
    assert results["bitcast"] == 0x3F800000


def test_every_step_reaches_the_host_history(results):
    assert results["count"] == 3
    assert results["scale"] == 8.0
    assert results["batch"] == [1.0, True]


def test_forward_values_and_activation_gradients_leave_the_pure_step(results):
    output, inputs, internal, gradient = results["wide"]
    assert output > 0 and inputs == 1.0  # forward values, through the loss function's outputs
    assert internal == -1.0  # not an attention layer: nothing recorded
    assert gradient > 0  # weight and activation gradients (the carrier's), under the scale


def test_activation_gradients_of_a_layer_called_twice_are_their_largest(results):
    recorded, (into_first_call, into_second_call) = results["carrier"]
    assert into_first_call > into_second_call > 1.0  # the weight gradient is ~0.06, far below
    assert recorded == pytest.approx(into_first_call, rel=2e-3)  # float16 rounding
    assert recorded < into_first_call + into_second_call - 1.0  # a maximum, not a sum


def test_a_failed_step_raises_the_status_until_cleared(results):
    assert results["status"] == [[1, 0], [0, 0]]
