"""The guard telemetry's state and hooks on TensorFlow (autoprec/_backends/tensorflow.py)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from autoprec import PrecisionPlan
from autoprec._backends import instrument_backend
from autoprec._backends import tensorflow as tf_backend
from autoprec._backends.instrument import bit_view
from autoprec.runtime import apply_plan
from autoprec.runtime.telemetry import GuardTelemetry


def test_the_telemetry_backend_on_tensorflow_is_this_module():
    assert instrument_backend() is tf_backend
    hooks = tf_backend.TelemetryHooks(np.full((4, 2, 4), -1.0, np.float32))
    assert hooks.measures_bfloat16_lazily and hooks.integer_amax_is_fast(xla=True)
    assert hooks.read_count() == 0
    assert hooks.read_history().shape == (4, 2, 4)
    assert hooks.read_status().tolist() == [0, 0]


def test_replica_variables_are_set_and_read_on_every_replica():
    variable = tf_backend.replica_local_variable(np.zeros(3, np.int32), "a/b c")
    assert variable.name.startswith("a_b_c")
    tf_backend.assign_every_replica(variable, np.array([1, 2, 3], np.int32))
    assert [value.tolist() for value in tf_backend.replica_values(variable)] == [[1, 2, 3]]


def test_a_flag_on_one_replica_is_its_own_every_replica_value():
    assert tf_backend.replicas_in_sync() == 1
    for flag in (True, False):
        assert bool(tf_backend.every_replica(tf.constant(flag))) is flag


def test_bitcast_takes_scalars():
    assert int(bit_view(tf.constant(1.0), "int32")) == 0x3F800000
    half = bit_view(np.float16(1.0), "int16")
    assert half.dtype == tf.int16 and int(half) == 0x3C00


def test_loss_scale_reads_the_optimizers_dynamic_scale():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    assert float(tf_backend.loss_scale(model)) == 1.0
    model.compile(
        optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(), 256.0), loss="mse"
    )
    model.optimizer.build(model.trainable_variables)
    assert float(tf_backend.loss_scale(model)) == 256.0


def test_hooks_record_every_step_of_a_real_fit_and_clear_the_status():
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, name="wide"), keras.layers.Dense(1, name="out")]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32")
    handle = apply_plan(model, plan)
    telemetry = GuardTelemetry(model, handle.dtypes)
    telemetry.install()
    model.make_train_function(force=True)
    x = np.ones((12, 4), "float32")
    x[8:] = np.nan  # the third step's batch is non-finite
    model.fit(x, np.zeros((12, 1)), batch_size=4, shuffle=False, verbose=0)
    hooks = telemetry.hooks
    assert hooks.read_count() == 3
    history = hooks.read_history()
    assert history[-2, 0, 1] == 1.0  # batch amax of the second step
    assert np.isnan(history[-1, 0, 1]) and hooks.read_status()[0] == 1
    assert history[-2, 1, 3] > 0 and np.isnan(history[-1, 1, 3])  # the Dense layer's gradients
    hooks.clear_status()
    assert hooks.read_status().tolist() == [0, 0]
    telemetry.remove()
    assert "train_step" not in vars(model)
