"""Runtime guard and fault injection: training survives overflow and says why (autoprec/runtime/guard.py)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from autoprec import AutoPrecision, PrecisionPlan
from autoprec.errors import AutoprecError
from autoprec.layers import layer_paths
from autoprec.runtime import PlanCallback
from autoprec.runtime.guard import (
    GUARD_BACKENDS,
    REMOVED_FIELDS,
    Guard,
    GuardWatch,
    NonFiniteTrainingError,
    check_guard_backend,
    promotion_target,
)


def _overflow_model():
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, name="first"),
            keras.layers.Dense(8, name="big"),
            keras.layers.Dense(1, name="out"),
        ],
        name="overflowing",
    )
    # `out` is frozen: with it trainable, float32 training from these weights on the
    # large inputs diverges (loss NaN); the guard must not hide that by skipping updates.
    model.get_layer("out").trainable = False
    model.compile(optimizer=keras.optimizers.SGD(1e-12), loss="mse")
    first_kernel, first_bias = model.get_layer("first").get_weights()
    model.get_layer("first").set_weights([np.full_like(first_kernel, 0.25), first_bias])
    big_kernel, big_bias = model.get_layer("big").get_weights()
    model.get_layer("big").set_weights([np.full_like(big_kernel, 100.0), big_bias])
    out_kernel, out_bias = model.get_layer("out").get_weights()
    model.get_layer("out").set_weights([np.full_like(out_kernel, 1e-6), out_bias])
    return model


def _data_that_starts_overflowing(normal: int = 40, large: int = 80):
    """Inputs of 1 first, then 1000: `big` then outputs ~8e5, above float16's 65504."""
    x = np.concatenate([np.ones((normal, 4)), np.full((large, 4), 1000.0)]).astype("float32")
    return x, np.zeros((normal + large, 1), "float32")


def test_layer_forced_to_overflow_mid_training_is_promoted_and_training_survives(capsys):
    model = _overflow_model()
    x, y = _data_that_starts_overflowing()
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32")
    callback = AutoPrecision(plan)
    history = model.fit(
        x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[callback]
    )
    promotions = [event for event in callback.plan.events if event["kind"] == "promotion"]
    assert promotions, callback.plan.events
    assert promotions[0]["layer"] == "big"  # where the overflow starts, not "first"
    assert promotions[0]["from"] == "float16"
    assert promotions[0]["to"] in ("bfloat16", "float32")
    assert "65504" in promotions[0]["evidence"] or "non-finite" in promotions[0]["evidence"]
    assert layer_paths(model)["big"].compute_dtype == promotions[0]["to"]
    assert layer_paths(model)["first"].compute_dtype == "float16"
    assert np.isfinite(history.history["loss"][-1])
    assert all(np.isfinite(weight).all() for weight in model.get_weights())
    output = capsys.readouterr()
    assert "autoprec guard: step" in output.out
    assert output.out.count("big float16 ->") == 1  # one line per promotion


def test_divergence_in_float32_is_reported_as_such_and_stops(caplog):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(1e3), loss="mse")  # diverges
    x = np.full((64, 4), 10.0, "float32")
    y = np.zeros((64, 1), "float32")
    callback = AutoPrecision(PrecisionPlan.uniform(model, "float32"), verbose=0)
    with caplog.at_level("WARNING", logger="autoprec"):
        model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[callback])
    events = callback.plan.events
    assert events and events[-1]["kind"] == "stopped"
    assert events[-1]["evidence"].startswith("non-finite loss at step")
    assert "a training divergence, not a precision problem. Training stopped." in caplog.text
    assert model.stop_training


def test_on_nan_raise():
    model = _overflow_model()
    x, y = _data_that_starts_overflowing()
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32")
    callback = AutoPrecision(plan, guard=Guard(on_nan="raise"), verbose=0)
    with pytest.raises(NonFiniteTrainingError, match="non-finite step"):
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[callback])


def test_bad_guard_settings_are_refused(mlp):
    with pytest.raises(AutoprecError, match="on_nan='ignore'"):
        AutoPrecision(PrecisionPlan.uniform(mlp, "float32"), guard=Guard(on_nan="ignore"))


def test_nan_in_input_batches_is_reported_not_fixed_by_promotion(caplog):
    model = _overflow_model()
    big_kernel = model.get_layer("big").get_weights()[0]
    model.get_layer("big").set_weights([np.full_like(big_kernel, 0.1), np.zeros(8, "float32")])
    x = np.ones((120, 4), "float32")
    x[40:72] = np.nan  # a run of bad batches, then clean data again
    y = np.zeros((120, 1), "float32")
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32")
    callback = AutoPrecision(plan, verbose=0)
    with caplog.at_level("WARNING", logger="autoprec"):
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    assert not [event for event in callback.plan.events if event["kind"] == "promotion"]
    assert [event for event in callback.plan.events if event["kind"] == "not_precision"]
    assert "NaN entered with the input data" in caplog.text
    assert layer_paths(model)["big"].compute_dtype == "float16"
    assert all(np.isfinite(weight).all() for weight in model.get_weights())


def test_promotion_target_follows_the_widening_ladder():
    assert promotion_target("float16", bfloat16_is_fast=True) == "bfloat16"
    assert promotion_target("float16", bfloat16_is_fast=False) == "float32"
    assert promotion_target("bfloat16", bfloat16_is_fast=True) == "float32"
    assert promotion_target("float32", bfloat16_is_fast=True) == "float32"


def test_plan_callback_guard_promotes_like_auto_precision():
    model = _overflow_model()
    x, y = _data_that_starts_overflowing()
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32")
    callback = PlanCallback(plan, verbose=0)
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[callback])
    promotions = [event for event in callback.plan.events if event["kind"] == "promotion"]
    assert promotions and promotions[0]["layer"] == "big"
    assert all(np.isfinite(weight).all() for weight in model.get_weights())


def test_guard_keeps_only_the_fields_a_user_sets():
    assert [field.name for field in dataclasses.fields(Guard)] == [
        "on_nan",
        "history_steps",
        "near_binades",
        "check_kernels",
        "float8_check_every",
    ]
    assert len(dataclasses.fields(Guard)) <= 5
    guard = Guard(on_nan="stop", history_steps=8, float8_check_every=3)
    assert Guard.from_config(guard.get_config()) == guard
    with pytest.raises(AutoprecError, match="history_steps must be an integer >= 1, got 0"):
        Guard(history_steps=0)
    with pytest.raises(AutoprecError, match="near_binades must be a positive number"):
        Guard(near_binades=0)
    with pytest.raises(AutoprecError, match="float8_check_every must be an integer >= 1"):
        Guard(float8_check_every=0)


@pytest.mark.parametrize("name", sorted(REMOVED_FIELDS))
def test_removed_fields_fail_as_python_does_and_old_configs_say_what_to_write(name):
    with pytest.raises(TypeError, match=name):
        Guard(**{name: 3})
    with pytest.raises(AutoprecError, match=rf"\['{name}'\] were removed from Guard") as error:
        Guard.from_config({"on_nan": "stop", name: 3})
    assert REMOVED_FIELDS[name] in str(error.value)


def test_old_configs_name_the_replacement():
    with pytest.raises(AutoprecError, match=r"LossScale\(floor=\.\.\.\)"):
        Guard.from_config({"min_loss_scale": 2.0**-10})
    with pytest.raises(AutoprecError, match="hardware="):
        Guard.from_config({"bfloat16_is_fast": False})
    with pytest.raises(AutoprecError, match="unknown field.*'guard_window'"):
        Guard.from_config({"guard_window": 3})


def test_a_guard_on_another_backend_is_refused_naming_it_and_guard_none():
    for backend in GUARD_BACKENDS:
        check_guard_backend(backend, "AutoPrecision")
    with pytest.raises(AutoprecError, match="'torch' backend. Pass guard=None"):
        check_guard_backend("torch", "AutoPrecision")


_OTHER_BACKEND = """
import autoprec
from autoprec.errors import AutoprecError
try:
    autoprec.AutoPrecision()
except AutoprecError as error:
    print("REFUSED", error)
callback = autoprec.AutoPrecision(guard=None)
print("GUARD", callback.guard)
"""


def test_asking_for_a_guard_on_keras_numpy_backend_is_a_clear_error():
    environment = {**os.environ, "KERAS_BACKEND": "numpy", "TF_CPP_MIN_LOG_LEVEL": "3"}
    completed = subprocess.run(
        [sys.executable, "-c", _OTHER_BACKEND],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "REFUSED AutoPrecision: the guard needs Keras' TensorFlow or JAX backend" in (
        completed.stdout
    )
    assert "'numpy' backend. Pass guard=None" in completed.stdout
    assert "GUARD None" in completed.stdout


def test_the_watch_reads_the_device_only_once_the_epoch_has_skipped_a_step():
    class Telemetry:
        reads = 0

        def failed_step(self, dtypes):
            Telemetry.reads += 1

    watch = GuardWatch()
    watch.attach(Telemetry())
    assert watch.observe(1, {"loss": 0.5, "skipped_steps": 0}, {"big": "float16"}, 2.0) is None
    assert Telemetry.reads == 0  # a healthy step costs no read of the kept batch
    watch.observe(2, {"loss": 0.5, "skipped_steps": 1}, {"big": "float16"}, 2.0)
    watch.observe(3, {"loss": 0.5}, {"big": "float16"}, 2.0)  # no count in the logs: read
    assert Telemetry.reads == 2
