"""The guard's in-step telemetry on real faults, and a guarded run's finite logs
(autoprec/runtime/telemetry.py, guard.py).

The amax maths is tested in `tests/backends/test_amax.py`, the record types in
`test_telemetry_records.py`, a step's trace and frame in `test_step_trace.py`.
"""

from __future__ import annotations

import collections
import math

import keras
import numpy as np
import pytest
from conftest import classification_data

import autoprec
from autoprec import LossScale, PrecisionPlan
from autoprec._backends.instrument import KeptStep
from autoprec.layers import layer_paths
from autoprec.runtime import FlooredLossScaleOptimizer, PlanCallback, apply_plan
from autoprec.runtime.guard import (
    Guard,
    NonFiniteTrainingError,
    lowered_loss_scale,
)
from autoprec.runtime.telemetry import (
    FORMAT_MAX,
    NOT_RECORDED,
    SKIPPED_STEPS,
    GuardTelemetry,
    LayerAmax,
    SkippedStepLogs,
    StepRecord,
    format_max,
    is_out_of_range,
    near_range_layers,
    replay_step,
    telemetry_paths,
)


def _finite_weights(model):
    return all(np.isfinite(weight).all() for weight in model.get_weights())


def _promotions(callback):
    return [event for event in callback.plan.events if event["kind"] == "promotion"]


def _dense_model(scale_middle=60.0):
    """Dense stack whose middle layer's outputs pass 65504 when inputs grow 30x."""
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu", name="d1"),
            keras.layers.Dense(16, name="middle"),
            keras.layers.Dense(16, activation="relu", name="d3"),
            keras.layers.Dense(1, name="head"),
        ],
        name="drift",
    )
    model.compile(optimizer=keras.optimizers.SGD(1e-12), loss="mse")
    kernel, bias = model.get_layer("middle").get_weights()
    model.get_layer("middle").set_weights([np.abs(kernel) * scale_middle, bias])
    return model


def _drift_data(steps=20, batch=8, onset=10, factor=300.0):
    rng = np.random.default_rng(0)
    x = np.abs(rng.normal(size=(steps * batch, 8))).astype("float32")
    x[onset * batch :] *= factor
    return x, np.zeros((steps * batch, 1), "float32")


def test_data_drift_mid_epoch_promotes_at_the_first_failing_step():
    model = _dense_model()
    x, y = _drift_data(factor=3000.0)
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    callback = PlanCallback(plan, verbose=0)
    history = model.fit(
        x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[callback]
    )
    promotions = _promotions(callback)
    assert promotions and promotions[0]["layer"] == "middle", callback.plan.events
    assert promotions[0]["step"] <= 11 + 2  # the first step with large inputs is 11
    assert "65504" in promotions[0]["evidence"]
    assert layer_paths(model)["middle"].compute_dtype != "float16"
    assert np.isfinite(history.history["loss"][-1])  # the next epoch is finite throughout
    assert _finite_weights(model)


def test_overflow_from_the_very_first_step_in_a_conv_model():
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, name="conv"),
            keras.layers.Conv2D(4, 3, name="conv_big"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(1, name="head"),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    kernel, bias = model.get_layer("conv_big").get_weights()
    model.get_layer("conv_big").set_weights([np.full_like(kernel, 50.0), bias])
    x = np.full((32, 8, 8, 1), 20.0, "float32")  # conv ~ +-200, conv_big ~ 7e4+
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    conv = model.get_layer("conv")
    kernel, bias = conv.get_weights()
    conv.set_weights([np.abs(kernel) + 0.1, bias])
    # conv's gradients through conv_big's large kernel overflow float16 at scale 1: a floor
    # below 1 lets the guard lower the scale instead of promoting conv.
    callback = PlanCallback(plan, loss_scale=LossScale(floor=2.0**-10), verbose=0)
    history = model.fit(
        x, np.zeros((32, 1), "float32"), batch_size=8, epochs=2, verbose=0, callbacks=[callback]
    )
    promotions = _promotions(callback)
    # conv_big overflows; the pooling's float16 sum of its large values may as well.
    assert "conv_big" in {event["layer"] for event in promotions}
    assert "conv" not in {event["layer"] for event in promotions}
    assert {event["step"] for event in promotions} <= {1, 2}  # a cascade, resolved at once
    assert np.isfinite(history.history["loss"][-1]) and _finite_weights(model)


def _two_branch_model():
    inputs = keras.Input((4,))
    left = keras.layers.Dense(4, name="left")(inputs)
    right = keras.layers.Dense(4, name="right")(inputs)
    joined = keras.layers.Concatenate()([left, right])
    outputs = keras.layers.Dense(1, name="head")(joined)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    for name in ("left", "right"):
        kernel, bias = model.get_layer(name).get_weights()
        model.get_layer(name).set_weights([np.full_like(kernel, 100.0), bias])
    return model


def test_all_layers_implicated_by_one_step_are_promoted_together():
    model = _two_branch_model()
    x = np.full((16, 4), 500.0, "float32")  # both branches reach 2e5
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    callback = PlanCallback(plan, verbose=0)
    model.fit(x, np.zeros((16, 1)), batch_size=4, epochs=1, verbose=0, callbacks=[callback])
    promotions = _promotions(callback)
    assert {event["layer"] for event in promotions} == {"left", "right"}
    assert {event["step"] for event in promotions} == {1}  # one step, one retrace
    assert _finite_weights(model)


def _bfloat16_nan_run(on_nan):
    model = _dense_model(scale_middle=1.0)
    x, y = _drift_data(factor=1.0)
    x[40:48] = np.nan  # the sixth batch holds NaN
    plan = PrecisionPlan.uniform(model, "bfloat16")
    callback = PlanCallback(plan, guard=Guard(on_nan=on_nan), verbose=0)
    history = model.fit(
        x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[callback]
    )
    return model, callback, history


def test_nan_batch_under_bfloat16_raises_naming_the_step_and_the_data():
    with pytest.raises(NonFiniteTrainingError, match="step 6.*came with the data"):
        _bfloat16_nan_run("raise")


def test_nan_batch_under_bfloat16_is_skipped_and_reported_in_promote_mode():
    model, callback, _ = _bfloat16_nan_run("promote")
    assert not _promotions(callback)
    reports = [event for event in callback.plan.events if event["kind"] == "not_precision"]
    assert reports and reports[0]["step"] == 6
    assert int(model.optimizer.non_finite_steps.numpy()) == 2  # one per epoch, counted
    assert _finite_weights(model)  # the NaN never reached the weights
    assert np.isfinite(model.evaluate(*_drift_data(factor=1.0), verbose=0))


def test_nan_batch_under_bfloat16_stops_in_stop_mode():
    model, callback, _ = _bfloat16_nan_run("stop")
    assert callback.plan.events[-1]["kind"] == "stopped"
    assert model.stop_training and _finite_weights(model)


def test_gradients_too_large_at_scale_one_lower_the_scale_below_one():
    def build():
        model = keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(16, activation="relu", name="a"),
                keras.layers.Dense(16, activation="relu", name="b"),
                keras.layers.Dense(1, name="head"),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(1e-9),
            loss=lambda target, prediction: 1e6 * keras.ops.mean((target - prediction) ** 2),
        )
        return model

    model, reference = build(), build()
    reference.set_weights(model.get_weights())
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = rng.normal(size=(256, 1)).astype("float32")
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    callback = PlanCallback(plan, loss_scale=LossScale(floor=2.0**-10), verbose=0)
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[callback])
    float32 = reference.fit(x, y, batch_size=16, epochs=3, verbose=0)
    skipped = int(model.optimizer.non_finite_steps.numpy())
    assert skipped <= 8, skipped  # found within a few steps, not one halving per step
    assert np.isfinite(history.history["loss"][1:]).all()
    # Within 5% of float32 from the same weights: the updates were not skipped.
    assert abs(history.history["loss"][-1] - float32.history["loss"][-1]) <= 0.05 * abs(
        float32.history["loss"][-1]
    )
    assert _finite_weights(model)


def test_attention_logits_that_grow_are_promoted_at_the_first_step_they_overflow():
    inputs = keras.Input((6, 8))
    attended = keras.layers.MultiHeadAttention(num_heads=1, key_dim=8, name="attention")(
        inputs, inputs
    )
    pooled = keras.layers.GlobalAveragePooling1D()(attended)
    outputs = keras.layers.Dense(1, name="head")(pooled)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    for name in ("query", "key"):
        sub = model.get_layer("attention")._query_dense if name == "query" else None
        sub = sub or model.get_layer("attention")._key_dense
        kernel, bias = sub.get_weights()
        sub.set_weights([np.full_like(kernel, 1.0), bias])
    steps = 24
    growth = np.geomspace(2.0, 40.0, steps).astype("float32")  # logits pass 65504 on the way
    x = np.concatenate([np.full((4, 6, 8), g, "float32") for g in growth])
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    callback = PlanCallback(plan, verbose=0)
    model.fit(
        x, np.zeros((len(x), 1)), batch_size=4, shuffle=False, verbose=0, callbacks=[callback]
    )
    promotions = _promotions(callback)
    attention = [event for event in promotions if event["layer"] == "attention"]
    assert attention, callback.plan.events
    assert "attention logits" in attention[0]["evidence"]
    skipped = int(model.optimizer.non_finite_steps.numpy())
    assert 1 <= skipped < steps - attention[0]["step"]  # a few, then none once promoted
    assert _finite_weights(model)


def test_a_second_fit_does_not_retrace_or_reapply():
    model = _dense_model(scale_middle=1.0)
    x, y = _drift_data(factor=1.0)
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    callback = PlanCallback(plan, verbose=0)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    function = model.train_function
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    assert model.train_function is function
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[PlanCallback(plan, verbose=0)])
    assert model.train_function is function


def test_pure_helpers():
    assert format_max("float16") == 65504.0 == FORMAT_MAX["float16"]
    assert is_out_of_range(float("inf"), "bfloat16") and is_out_of_range(7e4, "float16")
    assert not is_out_of_range(-1.0, "float16")
    assert lowered_loss_scale(32768.0, 1, 2.0**-10) == 16384.0
    assert lowered_loss_scale(32768.0, 3, 2.0**-10) == 2048.0
    assert lowered_loss_scale(2.0**-8, 4, 2.0**-10) == 2.0**-10


def _relu_stack(big=1.0):
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, name="a"),
            keras.layers.Activation("relu", name="relu"),
            keras.layers.Dense(16, name="b"),
            keras.layers.Dense(1, name="head"),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    kernel, bias = model.get_layer("a").get_weights()
    model.get_layer("a").set_weights([np.abs(kernel) + 0.1, bias])  # a's outputs all > 0
    kernel, bias = model.get_layer("b").get_weights()
    model.get_layer("b").set_weights([np.full_like(kernel, big), bias])
    return model


def test_a_replay_records_each_layers_amax_and_applies_nothing():
    model = _relu_stack(big=1e3)
    handle = apply_plan(
        model, PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    )
    model.make_train_function()
    function, weights = model.train_function, model.get_weights()
    iterations = int(model.optimizer.iterations.numpy())
    x = np.full((8, 8), 10.0, "float32")
    kept = KeptStep((x, np.zeros((8, 1), "float32")), loss_scale=4.0)
    record = replay_step(model, kept, handle.dtypes, {})
    a, b = record.layers["a"], record.layers["b"]
    assert set(record.layers) == set(telemetry_paths(model, handle.dtypes)) == {"a", "b"}
    assert record.batch_amax == 10.0
    assert b.input == pytest.approx(a.output, rel=1e-2) and a.output > 10.0
    assert math.isinf(b.output) and is_out_of_range(b.output, "float16")
    assert a.gradient != NOT_RECORDED and record.loss_scale == 4.0
    assert model.train_function is function  # fit's trace runs on
    assert int(model.optimizer.iterations.numpy()) == iterations
    assert all(np.array_equal(w, v) for w, v in zip(model.get_weights(), weights))
    assert "b" in near_range_layers(
        StepRecord(0, 1.0, 1.0, True, {"b": LayerAmax(output=2e4)}), {"b": "float16"}, 2.0
    )
    assert not near_range_layers(
        StepRecord(0, 1.0, 1.0, True, {"b": LayerAmax(output=1e4)}), {"b": "float16"}, 2.0
    )


def test_replays_in_one_fit_trace_the_probed_step_once_and_record_their_own_amax():
    model = _relu_stack(big=1e3)
    handle = apply_plan(
        model, PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    )
    model.optimizer = FlooredLossScaleOptimizer(model.optimizer, initial_scale=2.0)
    model.optimizer.build(model.trainable_variables)
    traces, step = [], model.train_step
    model.train_step = lambda *args: traces.append(1) or step(*args)
    telemetry = GuardTelemetry(model)
    telemetry.install()
    model.make_train_function(force=True)
    replays = []  # each step's record, and the traces of the train step so far

    def replay(batch, logs):
        replays.append((telemetry.failed_step(handle.dtypes), len(traces)))

    x = np.full((80, 8), 1e-3, "float32")
    for index, value in enumerate((50.0, 40.0, 30.0, 20.0, 10.0)):
        x[16 * index + 8 : 16 * index + 16] = value  # every second batch: b's outputs overflow
    callback = keras.callbacks.LambdaCallback(on_train_batch_end=replay)
    model.fit(x, np.zeros((80, 1)), batch_size=8, shuffle=False, verbose=0, callbacks=[callback])
    telemetry.remove()
    failed = [(record, count) for record, count in replays if record is not None]
    assert [record.batch_amax for record, _ in failed] == [50.0, 40.0, 30.0, 20.0, 10.0]
    assert len({count for _, count in failed}) == 1  # the first replay traced for all five
    # Each replay's amax is its own batch's, not the largest of the replays so far.
    ratios = [record.layers["a"].output / record.batch_amax for record, _ in failed]
    assert ratios == pytest.approx([ratios[0]] * 5, rel=1e-2)
    assert all(math.isinf(record.layers["b"].output) for record, _ in failed)


def test_bfloat16_layers_overflowing_are_promoted_at_their_step():
    model = _relu_stack(big=3e37)  # b's outputs pass bfloat16's max on the large batch
    model.get_layer("a").trainable = False  # (its gradients through b's kernel would overflow)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    plan = PrecisionPlan.uniform(model, "bfloat16").with_dtype("head", "float32")
    callback = PlanCallback(plan, verbose=0)
    x = np.concatenate([np.full((8, 8), 1e-3), np.full((8, 8), 10.0)]).astype("float32")
    model.fit(x, np.zeros((16, 1)), batch_size=8, shuffle=False, verbose=0, callbacks=[callback])
    promotions = _promotions(callback)
    assert [(event["layer"], event["step"]) for event in promotions] == [("b", 2)], promotions
    assert "non-finite bfloat16 outputs" in promotions[0]["evidence"]


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
    logs.active = True
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
    logs.active = True
    assert logs.active and math.isfinite(epoch_loss())
    logs.active = False
    assert not logs.active and math.isnan(epoch_loss())
    logs.active = True
    assert math.isfinite(epoch_loss())
    assert SkippedStepLogs.for_model(model) is logs  # not installed a second time
    assert all(np.isfinite(weight).all() for weight in model.get_weights())


class Pair(collections.namedtuple("Pair", ["value", "scale"])):
    """A result type only its own code builds: a rebuilt copy misses the keyword."""

    def __new__(cls, value, scale, *, checked):
        return super().__new__(cls, value, scale)


class ReturnsPair(keras.layers.Layer):
    def call(self, inputs):
        return Pair(inputs * 2.0, inputs[:, :1], checked=True)


class PairModel(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, name="hidden")
        self.pair = ReturnsPair(name="pair")
        self.head = keras.layers.Dense(1, name="head")

    def call(self, inputs):
        pair = self.pair(self.hidden(inputs))
        return self.head(pair.value * pair.scale)


def test_a_layer_whose_outputs_cannot_be_recorded_warns_once_and_the_fit_goes_on(caplog):
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    model = PairModel()
    model.compile(optimizer="adam", loss="mse")
    callback = autoprec.AutoPrecision(hardware="rtx4090", auto=autoprec.AutoPlan(profile_steps=2))
    with caplog.at_level("WARNING", logger="autoprec"):
        history = model.fit(x, x[:, :1], epochs=2, batch_size=8, verbose=0, callbacks=[callback])
    assert np.isfinite(history.history["loss"]).all()
    profiled = [line for line in caplog.messages if "pair" in line and "profiled" in line]
    assert len(profiled) == 1 and "TypeError" in profiled[0]

    caplog.clear()
    model = PairModel()
    model.compile(optimizer="adam", loss="mse")
    model(x[:2])
    plan = autoprec.PrecisionPlan.uniform(model, "float16")
    with caplog.at_level("WARNING", logger="autoprec"):
        history = model.fit(
            x,
            x[:, :1],
            epochs=2,
            batch_size=8,
            verbose=0,
            callbacks=[autoprec.AutoPrecision(plan, verbose=0)],
        )
    assert np.isfinite(history.history["loss"]).all()
    assert not [line for line in caplog.messages if "pair" in line]  # no wrap in a normal step


def test_a_jit_compiled_step_keeps_the_batch_it_skipped():
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, name="a"),
            keras.layers.Dense(16, name="big"),
            keras.layers.Dense(1, name="head"),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse", jit_compile=True)
    kernel, bias = model.get_layer("big").get_weights()
    model.get_layer("big").set_weights([np.full_like(kernel, 100.0), bias])
    x = np.ones((64, 8), "float32")
    x[40:] = 1000.0  # the sixth batch on: big's outputs pass 65504
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    callback = PlanCallback(plan, verbose=0)
    model.fit(x, np.zeros((64, 1)), batch_size=8, shuffle=False, verbose=0, callbacks=[callback])
    promotions = _promotions(callback)
    assert (promotions[0]["layer"], promotions[0]["step"]) == ("big", 6), promotions
    assert _finite_weights(model)
