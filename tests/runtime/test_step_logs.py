"""Tests for autoprec.runtime.telemetry: a step the guard skipped leaves no NaN in the logs.

Real Keras training runs on the TensorFlow backend: a batch of NaN or inf inputs makes one
step's loss non-finite; under `AutoPrecision`'s guard the epoch's loss and metrics stay
finite, the logs count the step in `skipped_steps` (per epoch) and the weights stay finite.
`SkippedStepLogs` is also driven directly on plain compiled models.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
from conftest import classification_data

import autoprec
from autoprec import PrecisionPlan
from autoprec.runtime.telemetry import SKIPPED_STEPS, SkippedStepLogs

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="SkippedStepLogs wraps TensorFlow train steps"
)

BATCH = 16


def small_classifier(optimizer=None) -> keras.Model:
    """Dense 16, linear (a ReLU may map NaN to 0), and a head, with a loss and an accuracy metric."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, name="hidden"),
            keras.layers.Dense(3, name="head"),
        ],
        name="small_classifier",
    )
    model.compile(
        optimizer=optimizer if optimizer is not None else keras.optimizers.SGD(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def poisoned_data(bad_batches=(1,), value=np.nan, batches: int = 4):
    """`batches` batches of `BATCH` samples; the inputs of `bad_batches` hold `value`."""
    x, y = classification_data(samples=batches * BATCH)
    for batch in bad_batches:
        x[batch * BATCH : (batch + 1) * BATCH, 0] = value
    return x, y


def metric_variables(model: keras.Model) -> dict[str, float]:
    return {variable.path: float(variable.numpy()) for variable in model.metrics_variables}


@pytest.mark.parametrize(
    ("dtype", "poison"),
    [("float16", np.nan), ("bfloat16", np.inf)],
    ids=["float16-loss-scaling-nan-inputs", "bfloat16-step-skipping-inf-inputs"],
)
def test_a_guarded_run_keeps_finite_logs_and_counts_the_skipped_step_per_epoch(dtype, poison):
    model = small_classifier()
    x, y = poisoned_data(bad_batches=(1,), value=poison)
    plan = PrecisionPlan.uniform(model, dtype).with_dtype("head", "float32")
    callback = autoprec.AutoPrecision(plan, verbose=0)
    history = model.fit(
        x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0, callbacks=[callback]
    )
    logs = history.history
    assert len(logs["loss"]) == 3  # the guard did not stop the run
    assert all(math.isfinite(loss) for loss in logs["loss"])
    assert all(math.isfinite(accuracy) for accuracy in logs["accuracy"])
    # One bad batch per epoch: the count starts again at each epoch (the optimizer's is 3).
    assert logs[SKIPPED_STEPS] == [1.0, 1.0, 1.0]
    assert int(model.optimizer.non_finite_steps.numpy()) == 3
    assert all(np.isfinite(weight).all() for weight in model.get_weights())
    # The metric variables left the skipped step out: 3 good batches in the last epoch.
    counts = [value for path, value in metric_variables(model).items() if "count" in path]
    assert counts and all(count == 3 * BATCH for count in counts)
    assert [event["kind"] for event in callback.plan.events] == ["not_precision"] * 3
    assert SkippedStepLogs.for_model(model).active


def test_an_active_wrapper_reports_a_non_finite_step_as_if_it_had_not_run():
    clean_model = small_classifier()
    weights = clean_model.get_weights()
    x, y = poisoned_data(bad_batches=(2,), batches=3)  # the last batch is the bad one
    clean = clean_model.fit(
        x[: 2 * BATCH], y[: 2 * BATCH], batch_size=BATCH, shuffle=False, verbose=0
    ).history

    model = small_classifier()
    model.set_weights(weights)
    logs = SkippedStepLogs.for_model(model)
    logs.activate()
    logs.start_epoch()  # a plain optimizer counts no skipped step: nothing to count from
    guarded = model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history
    # Same two good steps, then the NaN step left the metrics where they were.
    assert guarded["loss"] == pytest.approx(clean["loss"], rel=1e-6)
    assert guarded["accuracy"] == pytest.approx(clean["accuracy"], rel=1e-6)
    assert SKIPPED_STEPS not in guarded  # no counter on the optimizer, no count in the logs

    unguarded_model = small_classifier()
    unguarded_model.set_weights(weights)
    SkippedStepLogs.for_model(unguarded_model)  # installed but not active: Keras' own logs
    unguarded = unguarded_model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history
    assert math.isnan(unguarded["loss"][0])


def test_the_wrapper_is_installed_once_and_follows_active_from_the_next_trace():
    # Keras' loss-scale optimizer skips the non-finite step: the weights stay finite.
    model = small_classifier(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.05)))
    logs = SkippedStepLogs.for_model(model)
    assert SkippedStepLogs.for_model(model) is logs and logs.model is model
    assert SkippedStepLogs.for_model(small_classifier()) is not logs
    assert logs.supported and not logs.active
    x, y = poisoned_data(bad_batches=(1,), batches=3)

    def epoch_loss() -> float:
        model.make_train_function(force=True)  # trace the step again
        return model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history["loss"][0]

    assert math.isnan(epoch_loss())
    logs.activate()
    assert logs.active and math.isfinite(epoch_loss())
    logs.deactivate()
    assert not logs.active and math.isnan(epoch_loss())
    logs.activate()
    assert math.isfinite(epoch_loss())
    assert SkippedStepLogs.for_model(model) is logs  # not installed a second time
    assert all(np.isfinite(weight).all() for weight in model.get_weights())
