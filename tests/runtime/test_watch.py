"""The guard's read of each step into a `StepOutcome`, on a real telemetry run (autoprec/runtime/guard.py)."""

from __future__ import annotations

import keras
import numpy as np

from autoprec import PrecisionPlan
from autoprec.runtime import FlooredLossScaleOptimizer, apply_plan
from autoprec.runtime.guard import GuardWatch, is_finite_number
from autoprec.runtime.telemetry import GuardTelemetry


def _overflowing_model() -> keras.Model:
    """`big` outputs ~8e5 (above float16's 65504) once the inputs are 1000 instead of 1."""
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, name="first"),
            keras.layers.Dense(8, name="big"),
            keras.layers.Dense(1, name="out"),
        ]
    )
    model.get_layer("out").trainable = False
    model.compile(optimizer=keras.optimizers.SGD(1e-12), loss="mse")
    for name, value in (("first", 0.25), ("big", 100.0), ("out", 1e-6)):
        kernel, bias = model.get_layer(name).get_weights()
        model.get_layer(name).set_weights([np.full_like(kernel, value), bias])
    return model


class _Observer(keras.callbacks.Callback):
    def __init__(self, watch: GuardWatch, dtypes: dict[str, str]) -> None:
        super().__init__()
        self.watch, self.dtypes, self.step, self.outcomes = watch, dtypes, 0, []

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        outcome = self.watch.observe(self.step, logs, self.dtypes, near_binades=2.0)
        if outcome is not None:
            self.outcomes.append(outcome)


def test_a_failed_step_is_read_once_with_its_attribution_and_scale():
    model = _overflowing_model()
    handle = apply_plan(model, PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32"))
    model.optimizer = FlooredLossScaleOptimizer(model.optimizer, initial_scale=1024.0)
    model.optimizer.build(model.trainable_variables)
    telemetry = GuardTelemetry(model)
    telemetry.install()
    model.make_train_function(force=True)
    watch = GuardWatch()
    watch.attach(telemetry)
    observer = _Observer(watch, handle.dtypes)
    x = np.concatenate([np.ones((40, 4)), np.full((12, 4), 1000.0)]).astype("float32")
    model.fit(x, np.zeros((52, 1)), batch_size=4, shuffle=False, verbose=0, callbacks=[observer])
    assert [outcome.step for outcome in observer.outcomes] == [11, 12, 13]  # each failed step
    first = observer.outcomes[0]
    assert first.attribution.cause == "forward" and first.attribution.layers == ("big",)
    assert first.loss_scale == 1024.0
    assert watch.last_failed_index == 13
    watch.failures_in_a_row = 3
    watch.last_failed_index = 2  # the next failure does not follow this one: the run restarts
    model.fit(x[-4:], np.zeros((4, 1)), batch_size=4, verbose=0, callbacks=[observer])
    assert watch.failures_in_a_row == 0 and watch.last_failed_index == 14
    watch.detach()
    assert watch.telemetry is None and not telemetry.installed


def test_without_telemetry_the_logged_loss_is_read():
    watch = GuardWatch()
    dtypes = {"dense": "float32"}
    assert watch.observe(3, {"loss": 0.25}, dtypes, 2.0) is None
    outcome = watch.observe(4, {"loss": float("nan")}, dtypes, 2.0)
    assert outcome.step == 4 and not outcome.loss_finite and not outcome.has_16bit_layers
    assert watch.observe(
        5, {"loss": np.float32("inf")}, {"dense": "bfloat16"}, 2.0
    ).has_16bit_layers
    watch.stopped = True
    assert watch.observe(6, {"loss": float("nan")}, dtypes, 2.0) is None  # stopped for this fit


def test_is_finite_number():
    assert is_finite_number(1.5) and is_finite_number(np.float32(2.0))
    assert not is_finite_number(float("nan")) and not is_finite_number(np.float32("-inf"))
    assert is_finite_number("not a number") and is_finite_number(None)
