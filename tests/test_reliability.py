"""Runtime guard and fault injection: training survives overflow and says why (autoprec/guard.py)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from autoprec import AutoPrecision, PrecisionPlan
from autoprec.errors import AutoprecError
from autoprec.guard import GuardConfig, GuardState, NonFiniteTrainingError
from autoprec.layers import layer_paths


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
    callback = AutoPrecision(plan, guard_threshold=3, guard_check_every=2, guard_window=20)
    history = model.fit(
        x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[callback]
    )
    promotions = [event for event in callback.plan.events if event["kind"] == "promotion"]
    assert promotions, callback.events
    assert promotions[0]["layer"] == "big"  # where the overflow starts, not "first"
    assert promotions[0]["from"] == "float16"
    assert promotions[0]["to"] in ("bfloat16", "float32")
    assert "65504" in promotions[0]["evidence"] or "non-finite" in promotions[0]["evidence"]
    assert layer_paths(model)["big"].compute_dtype == promotions[0]["to"]
    assert layer_paths(model)["first"].compute_dtype == "float16"
    assert np.isfinite(history.history["loss"][-1])
    assert all(np.isfinite(weight).all() for weight in model.get_weights())
    assert "autoprec guard: step" in capsys.readouterr().out


def test_divergence_in_float32_is_reported_as_such_and_stops():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(1e3), loss="mse")  # diverges
    x = np.full((64, 4), 10.0, "float32")
    y = np.zeros((64, 1), "float32")
    callback = AutoPrecision(
        PrecisionPlan.uniform(model, "float32"), guard_check_every=1, verbose=0
    )
    model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[callback])
    assert callback.events and callback.events[-1]["kind"] == "stopped"
    assert model.stop_training


def test_on_nan_raise():
    model = _overflow_model()
    x, y = _data_that_starts_overflowing()
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32")
    callback = AutoPrecision(
        plan, on_nan="raise", guard_threshold=3, guard_check_every=2, verbose=0
    )
    with pytest.raises(NonFiniteTrainingError, match="non-finite step"):
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[callback])


def test_guard_state_counts_a_window_and_detects_collapse():
    state = GuardState(GuardConfig(threshold=3, window=10))
    assert not state.observe(step=5, non_finite_total=2, scale=1024.0, floor=1.0)
    assert state.observe(step=8, non_finite_total=3, scale=512.0, floor=1.0)
    fresh = GuardState(GuardConfig(threshold=100, window=10))
    assert fresh.observe(step=5, non_finite_total=1, scale=1.0, floor=1.0)  # at the floor
    old = GuardState(GuardConfig(threshold=3, window=10))
    old.observe(step=1, non_finite_total=2, scale=8.0, floor=1.0)
    assert not old.observe(step=30, non_finite_total=3, scale=8.0, floor=1.0)  # outside window


def test_bad_guard_settings_are_refused(mlp):
    with pytest.raises(AutoprecError, match="on_nan='ignore'"):
        AutoPrecision(PrecisionPlan.uniform(mlp, "float32"), on_nan="ignore")
