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


class LogGamma(keras.layers.Layer):
    """lgamma has a float16 but no bfloat16 kernel on TensorFlow's CPU."""

    def call(self, inputs):
        return keras.ops.cast(
            __import__("tensorflow").math.lgamma(inputs + keras.ops.cast(2.0, inputs.dtype)),
            inputs.dtype,
        )


class Determinant(keras.layers.Layer):
    """det has neither a float16 nor a bfloat16 kernel on TensorFlow's CPU."""

    def call(self, inputs):
        matrices = keras.ops.reshape(inputs, (-1, 2, 2))
        eye = keras.ops.eye(2, dtype=inputs.dtype)
        return keras.ops.reshape(__import__("tensorflow").linalg.det(matrices + eye), (-1, 1))


def _kernel_model():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(4, name="dense")(inputs)
    gamma = LogGamma(name="lgamma")(keras.layers.Activation("sigmoid")(hidden))
    determinant = Determinant(name="det")(gamma)
    outputs = keras.layers.Dense(1, name="out")(keras.layers.Concatenate()([gamma, determinant]))
    model = keras.Model(inputs, outputs, name="kernels")
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_missing_kernels_fall_back_before_the_first_step_and_are_logged(caplog):
    model = _kernel_model()
    plan = PrecisionPlan.uniform(model, "bfloat16").with_dtype("out", "float32")
    x = np.random.default_rng(0).uniform(size=(32, 4)).astype("float32")
    y = np.zeros((32, 1), "float32")
    callback = AutoPrecision(plan, verbose=0)
    with caplog.at_level("WARNING", logger="autoprec"):
        history = model.fit(x, y, epochs=1, batch_size=8, verbose=0, callbacks=[callback])
    paths = layer_paths(model)
    assert paths["lgamma"].compute_dtype == "float32"  # no bfloat16 lgamma on CPU
    assert paths["det"].compute_dtype == "float32"
    assert paths["dense"].compute_dtype == "bfloat16"
    fallen = {
        event["layer"]: event for event in callback.plan.events if event["kind"] == "missing_kernel"
    }
    assert set(fallen) == {"lgamma", "det"}
    assert fallen["det"]["from"] == "bfloat16" and fallen["det"]["to"] == "float32"
    assert "no bfloat16 kernel" in caplog.text
    assert np.isfinite(history.history["loss"][0])


def test_float16_falls_back_to_bfloat16_where_only_that_is_missing():
    from autoprec.kernels import find_missing_kernels

    model = _kernel_model()
    dtypes = {"dense": "float16", "lgamma": "float16", "det": "float16", "out": "float32"}
    missing = {item.path: item for item in find_missing_kernels(model, dtypes)}
    assert "lgamma" not in missing  # lgamma has a float16 kernel
    assert missing["det"].fallback == "float32"  # neither 16-bit kernel exists
    assert model.get_layer("det").compute_dtype == "float32"  # the check leaves policies alone


def test_nan_in_input_batches_is_reported_not_fixed_by_promotion(caplog):
    model = _overflow_model()
    big_kernel = model.get_layer("big").get_weights()[0]
    model.get_layer("big").set_weights([np.full_like(big_kernel, 0.1), np.zeros(8, "float32")])
    x = np.ones((120, 4), "float32")
    x[40:72] = np.nan  # a run of bad batches, then clean data again
    y = np.zeros((120, 1), "float32")
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32")
    callback = AutoPrecision(plan, guard_threshold=2, guard_check_every=2, verbose=0)
    with caplog.at_level("WARNING", logger="autoprec"):
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    assert not [event for event in callback.events if event["kind"] == "promotion"]
    assert [event for event in callback.events if event["kind"] == "not_precision"]
    assert "NaN entered with the input data" in caplog.text
    assert layer_paths(model)["big"].compute_dtype == "float16"
    assert all(np.isfinite(weight).all() for weight in model.get_weights())


def _finished_trials(storage_path):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    study = optuna.load_study(
        study_name="fault_injection", storage=JournalStorage(JournalFileBackend(str(storage_path)))
    )
    return study.trials


def test_search_killed_mid_study_resumes_without_losing_or_duplicating_trials(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import optuna

    worker = Path(__file__).resolve().parents[1] / "bench" / "search_worker.py"
    storage = tmp_path / "study.log"
    finished_states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    process = subprocess.Popen([sys.executable, str(worker), str(storage), "500"])
    deadline = time.time() + 240
    before = []
    while time.time() < deadline:
        time.sleep(0.5)
        if storage.exists():
            try:
                before = [t for t in _finished_trials(storage) if t.state in finished_states]
            except Exception:  # the study may not exist yet
                continue
            if len(before) >= 3:
                break
    process.send_signal(signal.SIGKILL)
    process.wait()
    before = [t for t in _finished_trials(storage) if t.state in finished_states]
    assert len(before) >= 3

    resumed = subprocess.run(
        [sys.executable, str(worker), str(storage), "3"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = _finished_trials(storage)
    by_number = {trial.number: trial for trial in after}
    assert len(by_number) == len(after)  # trial numbers are unique
    for trial in before:  # no finished trial lost or changed
        kept = by_number[trial.number]
        assert (kept.state, kept.value, kept.params) == (trial.state, trial.value, trial.params)
    warm_starts = [t for t in after if t.system_attrs.get("fixed_params") is not None]
    assert len(warm_starts) == len({str(sorted(t.params.items())) for t in warm_starts})
    assert len([t for t in after if t.state in finished_states]) >= len(before) + 3
