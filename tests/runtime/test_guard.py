"""Runtime guard and fault injection: training survives overflow and says why (autoprec/runtime/guard.py)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from autoprec import AutoPrecision, PrecisionPlan
from autoprec.errors import AutoprecError
from autoprec.layers import layer_paths
from autoprec.runtime import PlanCallback
from autoprec.runtime.guard import (
    Guard,
    GuardAction,
    GuardPhase,
    GuardState,
    NonFiniteTrainingError,
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
    callback = AutoPrecision(plan, guard=Guard(threshold=3, check_every=2, window=20))
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
        PrecisionPlan.uniform(model, "float32"), guard=Guard(check_every=1), verbose=0
    )
    model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[callback])
    assert callback.events and callback.events[-1]["kind"] == "stopped"
    assert model.stop_training


def test_on_nan_raise():
    model = _overflow_model()
    x, y = _data_that_starts_overflowing()
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32")
    callback = AutoPrecision(
        plan, guard=Guard(on_nan="raise", threshold=3, check_every=2), verbose=0
    )
    with pytest.raises(NonFiniteTrainingError, match="non-finite step"):
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[callback])


def test_guard_state_counts_a_window_and_detects_collapse():
    state = GuardState(Guard(threshold=3, window=10))
    assert not state.observe(step=5, non_finite_total=2, scale=1024.0, floor=1.0)
    assert state.observe(step=8, non_finite_total=3, scale=512.0, floor=1.0)
    fresh = GuardState(Guard(threshold=100, window=10))
    assert fresh.observe(step=5, non_finite_total=1, scale=1.0, floor=1.0)  # at the floor
    old = GuardState(Guard(threshold=3, window=10))
    old.observe(step=1, non_finite_total=2, scale=8.0, floor=1.0)
    assert not old.observe(step=30, non_finite_total=3, scale=8.0, floor=1.0)  # outside window


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
    callback = AutoPrecision(plan, guard=Guard(threshold=2, check_every=2), verbose=0)
    with caplog.at_level("WARNING", logger="autoprec"):
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    assert not [event for event in callback.events if event["kind"] == "promotion"]
    assert [event for event in callback.events if event["kind"] == "not_precision"]
    assert "NaN entered with the input data" in caplog.text
    assert layer_paths(model)["big"].compute_dtype == "float16"
    assert all(np.isfinite(weight).all() for weight in model.get_weights())


def test_promotion_target_follows_the_widening_ladder():
    assert promotion_target("float16", bfloat16_is_fast=True) == "bfloat16"
    assert promotion_target("float16", bfloat16_is_fast=False) == "float32"
    assert promotion_target("bfloat16", bfloat16_is_fast=True) == "float32"
    assert promotion_target("float32", bfloat16_is_fast=True) == "float32"


def test_guard_state_checks_only_when_due_and_while_watching():
    state = GuardState(Guard(check_every=5))
    assert state.phase is GuardPhase.WATCHING
    assert [step for step in range(1, 16) if state.is_check_due(step)] == [5, 10, 15]
    state.phase = GuardPhase.DIAGNOSING
    assert not state.is_check_due(10)


def test_guard_state_check_names_the_trigger():
    state = GuardState(Guard(threshold=2, window=10))
    assert state.check(step=2, loss=0.5, counters=(1, 1024.0, 1.0)) is None
    trigger = state.check(step=4, loss=0.5, counters=(2, 512.0, 1.0))
    assert trigger == "2 non-finite step(s) in the last 10 steps, loss scale 512"
    assert state.trigger == trigger
    without_counters = GuardState(Guard())
    assert without_counters.check(step=7, loss=1.0, counters=None) is None
    assert without_counters.check(step=8, loss=float("nan"), counters=None) == (
        "non-finite loss at step 8"
    )


@pytest.mark.parametrize(
    ("on_nan", "has_16bit", "action", "phase"),
    [
        ("promote", True, GuardAction.DIAGNOSE, GuardPhase.DIAGNOSING),
        ("stop", True, GuardAction.STOP, GuardPhase.STOPPED),
        ("raise", True, GuardAction.RAISE, GuardPhase.STOPPED),
        ("promote", False, GuardAction.DIVERGED, GuardPhase.STOPPED),
    ],
)
def test_guard_state_action_and_phase(on_nan, has_16bit, action, phase):
    state = GuardState(Guard(on_nan=on_nan))
    assert state.action(has_16bit) is action
    assert state.phase is phase


def test_guard_state_resume_counts_afresh_and_restart_keeps_the_window():
    state = GuardState(Guard(threshold=3, window=100))
    state.observe(step=10, non_finite_total=2, scale=8.0, floor=1.0)
    state.action(has_16bit_layers=True)
    state.restart()
    assert state.phase is GuardPhase.WATCHING and state.bad_steps_in_window == 2
    state.action(has_16bit_layers=True)
    state.resume()
    assert state.phase is GuardPhase.WATCHING and state.bad_steps_in_window == 0
    assert not state.observe(step=20, non_finite_total=4, scale=8.0, floor=1.0)  # 2 new only
    state.stop()
    assert state.phase is GuardPhase.STOPPED and not state.is_check_due(30)


def test_plan_callback_guard_promotes_like_auto_precision():
    model = _overflow_model()
    x, y = _data_that_starts_overflowing()
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32")
    callback = PlanCallback(plan, guard=Guard(threshold=3, check_every=2, window=20), verbose=0)
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[callback])
    promotions = [event for event in callback.plan.events if event["kind"] == "promotion"]
    assert promotions and promotions[0]["layer"] == "big"
    assert all(np.isfinite(weight).all() for weight in model.get_weights())
