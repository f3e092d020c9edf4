"""AutoPrecision callback: plan application inside fit, loss scaling and its floor (autoprec/callback.py)."""

from __future__ import annotations

import inspect
import logging
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import (
    build_mlp,
    classification_data,
    local_with_fast_16bit,
    local_with_fast_bfloat16,
)

import autoprec
from autoprec import AutoPrecision, PlanError, PrecisionPlan
from autoprec.callback import AutoPlan
from autoprec.errors import AutoprecError
from autoprec.hardware import resolve_hardware
from autoprec.layers import layer_paths
from autoprec.runtime import FlooredLossScaleOptimizer, Guard, LossScale


def _compiled(model, optimizer="adam", jit_compile=False):
    model.compile(
        optimizer=optimizer,
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        jit_compile=jit_compile,
    )
    return model


def test_float16_plan_adds_floored_loss_scaling_and_logs_the_scale(mlp, classification):
    x, y = classification
    _compiled(mlp)
    plan = PrecisionPlan.uniform(mlp, "float16").with_dtype("dense_2", "float32")
    history = mlp.fit(x, y, epochs=2, batch_size=32, verbose=0, callbacks=[AutoPrecision(plan)])
    assert isinstance(mlp.optimizer, FlooredLossScaleOptimizer)
    assert history.history["loss_scale"] == [2.0**15, 2.0**15]
    assert layer_paths(mlp)["dense"].compute_dtype == "float16"
    assert all(np.isfinite(history.history["loss"]))


def test_bfloat16_plan_gets_no_loss_scaling(mlp, classification):
    x, y = classification
    _compiled(mlp)
    history = mlp.fit(
        x,
        y,
        epochs=1,
        verbose=0,
        callbacks=[AutoPrecision(PrecisionPlan.uniform(mlp, "bfloat16"))],
    )
    # No loss scaling, but with the guard on a non-finite step is still skipped and counted.
    assert not autoprec.runtime.loss_scale.scales_loss(mlp.optimizer)
    assert isinstance(mlp.optimizer, FlooredLossScaleOptimizer) and mlp.optimizer.fixed
    assert float(mlp.optimizer.dynamic_scale.numpy()) == 1.0
    assert autoprec.runtime.current_loss_scale(mlp.optimizer) is None
    assert "loss_scale" not in history.history
    assert layer_paths(mlp)["dense_1"].compute_dtype == "bfloat16"


def test_optimizer_is_wrapped_once_and_keeps_its_state(mlp, classification):
    x, y = classification
    _compiled(mlp)
    mlp.fit(x, y, epochs=1, batch_size=32, verbose=0)
    inner = mlp.optimizer
    steps_before = int(inner.iterations.numpy())
    moments_before = [keras.ops.convert_to_numpy(v) for v in inner.variables]
    plan = PrecisionPlan.uniform(mlp, "float16")
    callback = AutoPrecision(plan, verbose=0)
    mlp.fit(x, y, epochs=1, batch_size=32, verbose=0, callbacks=[callback])
    wrapped = mlp.optimizer
    assert wrapped.inner_optimizer is inner
    assert int(inner.iterations.numpy()) == steps_before + 4
    assert any(
        not np.array_equal(before, keras.ops.convert_to_numpy(after))
        for before, after in zip(moments_before, inner.variables)
    )
    mlp.fit(x, y, epochs=1, batch_size=32, verbose=0, callbacks=[AutoPrecision(plan, verbose=0)])
    assert mlp.optimizer is wrapped  # never wrapped twice
    callback.restore()
    assert mlp.optimizer is inner
    assert layer_paths(mlp)["dense"].compute_dtype == "float32"


def _tiny_gradient_model():
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(4, name="hidden"),
            keras.layers.Dense(1, name="out"),
        ],
        name="tiny",
    )
    model.compile(
        optimizer=keras.optimizers.SGD(10.0),
        loss=lambda target, prediction: 1e-7 * keras.ops.mean((target - prediction) ** 2),
    )
    return model


def test_gradients_that_underflow_float16_train_with_loss_scaling():
    # d(loss)/d(prediction) is about 1e-8, below float16's smallest subnormal (6e-8).
    x = np.ones((16, 4), "float32")
    y = np.zeros((16, 1), "float32")
    plan = PrecisionPlan.uniform(_tiny_gradient_model(), "float16")

    unscaled = _tiny_gradient_model()
    start = unscaled.get_layer("hidden").get_weights()[0].copy()
    autoprec.apply_plan(unscaled, plan)  # float16 without loss scaling
    unscaled.fit(x, y, epochs=2, verbose=0)
    assert np.array_equal(unscaled.get_layer("hidden").get_weights()[0], start)

    keras.utils.set_random_seed(0)
    keras.backend.clear_session()
    scaled = _tiny_gradient_model()
    scaled.get_layer("hidden").set_weights(unscaled.get_layer("hidden").get_weights())
    scaled.get_layer("out").set_weights(unscaled.get_layer("out").get_weights())
    scaled.fit(x, y, epochs=2, verbose=0, callbacks=[AutoPrecision(plan, verbose=0)])
    assert not np.array_equal(scaled.get_layer("hidden").get_weights()[0], start)


def test_mixed_plan_trains_to_float32_loss_within_tolerance():
    x, y = classification_data(samples=256)
    losses = {}
    initial = build_mlp().get_weights()
    for name in ("float32", "mixed"):
        keras.backend.clear_session()
        model = _compiled(build_mlp(), optimizer=keras.optimizers.Adam(0.01))
        model.set_weights(initial)
        callbacks = []
        if name == "mixed":
            plan = (
                PrecisionPlan.uniform(model, "bfloat16")
                .with_dtype("dense_1", "float16")
                .with_dtype("dense_2", "float32")
            )
            callbacks = [AutoPrecision(plan, verbose=0)]
        history = model.fit(
            x, y, epochs=8, batch_size=32, shuffle=False, verbose=0, callbacks=callbacks
        )
        losses[name] = history.history["loss"][-1]
    assert losses["float32"] < 0.5  # the task is learnable
    assert abs(losses["mixed"] - losses["float32"]) < 0.05 + 0.1 * losses["float32"]


def test_loss_scale_floor_holds_and_weights_stay_finite_under_persistent_overflow():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.full((300, 4), 1e4, "float32")  # float16 activations overflow on every step
    y = np.zeros((300, 1), "float32")
    # The guard would promote the overflowing layers; this test is about the floor alone.
    callback = AutoPrecision(PrecisionPlan.uniform(model, "float16"), guard=None, verbose=0)
    model.fit(x, y, batch_size=1, epochs=1, verbose=0, callbacks=[callback])
    optimizer = model.optimizer
    assert float(optimizer.dynamic_scale.numpy()) == 1.0  # Keras alone would reach 0.0
    assert int(optimizer.non_finite_steps.numpy()) == 300
    assert int(optimizer.consecutive_non_finite_steps.numpy()) == 300
    assert all(np.isfinite(weight).all() for weight in model.get_weights())


def test_fixed_loss_scale_stays_fixed(mlp, classification):
    x, y = classification
    _compiled(mlp)
    plan = PrecisionPlan.uniform(mlp, "float16")
    history = mlp.fit(
        x, y, epochs=2, verbose=0, callbacks=[AutoPrecision(plan, loss_scale=128, verbose=0)]
    )
    assert history.history["loss_scale"] == [128.0, 128.0]
    assert mlp.optimizer.fixed


def test_bad_arguments_are_refused(mlp):
    plan = PrecisionPlan.uniform(mlp, "float16")
    with pytest.raises(PlanError, match="loss_scale=None.*float16"):
        AutoPrecision(plan, loss_scale=None)
    with pytest.raises(PlanError, match="'static' is not valid; use 'dynamic', a positive number"):
        AutoPrecision(plan, loss_scale="static")
    with pytest.raises(PlanError, match="loss_scale=-8 is not valid"):
        AutoPrecision(plan, loss_scale=-8)
    with pytest.raises(PlanError, match="must be a PrecisionPlan"):
        AutoPrecision({"dense": "float16"})


def test_plan_path_saves_the_plan_used(mlp, classification, tmp_path):
    x, y = classification
    _compiled(mlp)
    path = tmp_path / "used.json"
    plan = PrecisionPlan.uniform(mlp, "float16")
    mlp.fit(x, y, epochs=1, verbose=0, callbacks=[AutoPrecision(plan, plan_path=path, verbose=0)])
    saved = PrecisionPlan.load(path)
    assert saved.layers["dense"] == "float16"
    assert saved.metadata["loss_scale"]["current"] == 2.0**15
    assert AutoPrecision(str(path), verbose=0).plan == saved


def test_jit_compiled_training_with_a_plan(classification):
    x, y = classification
    model = _compiled(build_mlp(), jit_compile=True)
    plan = PrecisionPlan.uniform(model, "bfloat16").with_dtype("dense_1", "float16")
    history = model.fit(x, y, epochs=1, verbose=0, callbacks=[AutoPrecision(plan, verbose=0)])
    assert np.isfinite(history.history["loss"][0])
    assert layer_paths(model)["dense_1"].compute_dtype == "float16"


class AttentionClassifier(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
        self.pool = keras.layers.GlobalAveragePooling1D()
        self.head = keras.layers.Dense(2, activation="softmax")

    def call(self, inputs):
        return self.head(self.pool(self.attention(inputs, inputs)))


def test_unbuilt_subclassed_model_gets_the_plan_at_first_trace():
    reference = AttentionClassifier()
    reference(np.zeros((1, 8, 8), "float32"))
    plan = PrecisionPlan.uniform(reference, "bfloat16").with_dtype("head", "float32")
    model = AttentionClassifier()
    assert not model.built
    model.compile("adam", "sparse_categorical_crossentropy")
    x = np.random.default_rng(0).normal(size=(32, 8, 8)).astype("float32")
    y = np.zeros(32, "int32")
    model.fit(x, y, epochs=1, verbose=0, callbacks=[AutoPrecision(plan, verbose=0)])
    paths = layer_paths(model)
    assert paths["attention/softmax"].compute_dtype == "bfloat16"
    assert paths["head"].compute_dtype == "float32"


def test_evaluate_and_predict_use_the_plan_after_training(cnn):
    x = np.random.default_rng(0).normal(size=(32, 12, 12, 1)).astype("float32")
    y = np.zeros(32, "int32")
    _compiled(cnn)
    plan = PrecisionPlan.uniform(cnn, "bfloat16").with_dtype("dense", "float32")
    cnn.fit(x, y, epochs=1, verbose=0, callbacks=[AutoPrecision(plan, verbose=0)])
    probe = keras.Model(cnn.inputs[0], cnn.get_layer("conv2d").output)
    assert keras.backend.standardize_dtype(probe.predict(x[:2], verbose=0).dtype) in (
        "bfloat16",
        "float32",  # predict converts outputs to NumPy, which may upcast
    )
    assert cnn.get_layer("conv2d").compute_dtype == "bfloat16"
    assert np.isfinite(cnn.evaluate(x, y, verbose=0)[0])


def test_attention_model_with_float16_attention_trains(attention_model):
    x = np.random.default_rng(1).normal(size=(32, 8, 8)).astype("float32")
    y = np.zeros(32, "int32")
    _compiled(attention_model)
    plan = PrecisionPlan.uniform(attention_model, "float16").with_rule(
        class_name="Softmax", dtype="float32"
    )
    history = attention_model.fit(
        x, y, epochs=1, verbose=0, callbacks=[AutoPrecision(plan, verbose=0)]
    )
    assert np.isfinite(history.history["loss"][0])


MIRRORED_SCRIPT = textwrap.dedent(
    """
    import os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
    import keras, numpy as np, autoprec
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(3, activation="softmax")])
        model.compile("adam", "sparse_categorical_crossentropy")
    plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("dense_1", "float32")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = rng.integers(0, 3, 64)
    history = model.fit(x, y, epochs=2, batch_size=16, verbose=0,
                        callbacks=[autoprec.AutoPrecision(plan, verbose=0)])
    assert strategy.num_replicas_in_sync == 2
    assert isinstance(model.optimizer, autoprec.FlooredLossScaleOptimizer)
    assert model.layers[0].compute_dtype == "float16"
    assert all(np.isfinite(history.history["loss"])), history.history
    print("OK", history.history["loss_scale"])
    """
)


def test_mirrored_strategy_on_two_logical_cpus(tmp_path):
    script = tmp_path / "mirrored.py"
    script.write_text(MIRRORED_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK" in result.stdout


def test_one_liner_profiles_decides_applies_and_reports(classification, capsys, tmp_path):
    x, y = classification
    model = _compiled(build_mlp())
    callback = AutoPrecision(
        hardware=local_with_fast_16bit(),  # float16's ranges are in question: it profiles
        auto=AutoPlan(profile_steps=2, decision_seconds=120.0),
        plan_path=tmp_path / "auto.json",
    )
    history = model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[callback])
    output = capsys.readouterr().out
    assert "profiling the first 2 steps" in output
    assert "autoprec: automatic plan:" in output
    assert callback.profile is not None and "dense" in callback.profile.layers
    plan = callback.plan
    # The plan kept is the one whose whole step measured fastest (a tie: the simpler one).
    measured = plan.metadata["measured"]
    assert "timed the whole train step of float32" in output
    winner = measured.get("winner")  # None: an 8-step epoch ended before every plan was timed
    assert f"keeping {winner or 'the per-layer plan'}" in output
    if winner in (None, "per-layer"):
        # The per-layer plan starts from a uniform policy; each layer off it says why.
        assert "  start: uniform " in output
        for path, entry in plan.metadata["evidence"].items():
            assert plan.layers[path] == entry["dtype"]
            assert f"{entry['dtype']} {path}: {entry['kind']}: " in output
    paths = layer_paths(model)
    for path, dtype in callback.handle.dtypes.items():
        assert paths[path].compute_dtype == dtype
    assert PrecisionPlan.load(tmp_path / "auto.json") == plan
    assert all(np.isfinite(history.history["loss"]))


def test_where_only_bfloat16_runs_fast_nothing_is_profiled_and_the_race_fits_its_budget(
    classification, capsys
):
    x, y = (np.concatenate([part] * 8) for part in classification)  # room for the race
    model = _compiled(build_mlp())
    callback = AutoPrecision(
        hardware=local_with_fast_bfloat16(), auto=AutoPlan(decision_seconds=120.0)
    )
    history = model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[callback])
    output = capsys.readouterr().out
    assert "bfloat16 keeps float32's range, nothing to profile; deciding after 3 steps" in output
    assert "profiling" not in output and callback.profile is None
    assert "timed the whole train step of float32, mixed_bfloat16" in output
    measured = callback.plan.metadata["measured"]
    assert measured["candidates_timed"] >= 2 and measured["winner"] in measured["rounds_ms"]
    assert all(np.isfinite(history.history["loss"]))
    # A short fit: half the predicted gain over the steps left cannot pay for bfloat16's trace
    # (float32 would run on fit's own):
    # the simpler plan, float32, at once, with the reason.
    model = _compiled(build_mlp())
    callback = AutoPrecision(hardware=local_with_fast_bfloat16(), verbose=0)
    functions = TrainFunctions()
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[callback, functions])
    measured = callback.plan.metadata["measured"]
    why = measured["why"]
    assert "needs 1 trace(s) of about" in why and "keeping float32, the simpler plan" in why
    steps_left = len(x) // 16 - 3  # deciding after 3 steps
    assert "predicted" in why and f"over {steps_left} steps left" in why
    assert measured["race_budget_seconds"] < 2 * measured["budget_seconds"] + 1
    # The gain is predicted from this CPU's rated peaks, which say what runs, not how fast: the
    # race may spend at least what the decision budget leaves (to measure it).
    left_over = measured["budget_seconds"] - measured["decision_seconds"]
    assert measured["race_budget_seconds"] >= left_over - 0.002
    assert set(callback.handle.dtypes.values()) == {"float32"}
    # Nothing changed: the step fit traced first runs on, not traced again.
    assert len(set(functions.seen)) == 1 and len(functions.seen) == len(x) // 16


def test_the_race_runs_on_into_the_next_epoch_and_ends_inside_the_last(classification, capsys):
    x, y = (part[:64] for part in classification)  # 4 steps an epoch: the race needs more
    model = _compiled(build_mlp())
    callback = AutoPrecision(
        hardware=local_with_fast_bfloat16(), auto=AutoPlan(timing_rounds=2, decision_seconds=120.0)
    )
    epochs = EpochPolicies()
    history = model.fit(x, y, epochs=12, batch_size=16, verbose=0, callbacks=[callback, epochs])
    measured = callback.plan.metadata["measured"]
    assert measured["steps"] > 4 and measured["winner"] in measured["rounds_ms"]
    assert "timed the whole train step of float32, mixed_bfloat16" in capsys.readouterr().out
    # From the epoch after the race on, every epoch ends in the plan kept.
    kept = set(callback.handle.dtypes.values())
    race_epochs = -(-(3 + measured["steps"]) // 4)
    assert all(dtypes == kept for dtypes in epochs.seen[race_epochs:])
    assert len(epochs.seen) == 12 and all(np.isfinite(history.history["loss"]))


class EpochPolicies(keras.callbacks.Callback):
    """Records the compute dtypes of the model's Dense layers at each epoch's end."""

    def __init__(self):
        super().__init__()
        self.seen: list[set[str]] = []

    def on_epoch_end(self, epoch, logs=None):
        dense = [layer for layer in self.model.layers if isinstance(layer, keras.layers.Dense)]
        self.seen.append({layer.compute_dtype for layer in dense})


class TrainFunctions(keras.callbacks.Callback):
    """Records which compiled train function ran each step."""

    def __init__(self):
        super().__init__()
        self.seen: list[int] = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(id(self.model.train_function))


@pytest.mark.parametrize("hardware", ["cpu-generic", "local"])
def test_where_no_16_bit_dtype_runs_fast_the_one_liner_decides_at_once(
    hardware, classification, capsys
):
    if hardware == "local" and resolve_hardware("local").is_fast("bfloat16"):
        hardware = "cpu-generic"  # this host runs bfloat16 fast: a device that does not
    x, y = classification
    model = _compiled(build_mlp())
    callback = AutoPrecision(hardware=hardware, auto=AutoPlan(profile_steps=2))
    history = model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[callback])
    output = capsys.readouterr().out
    assert output.count("autoprec:") == 1 and "no 16-bit dtype runs fast on" in output
    assert "profiling" not in output and "timing" not in output
    assert callback.profile is None and callback.estimate is None
    assert set(callback.handle.dtypes.values()) == {"float32"}
    measured = callback.plan.metadata["measured"]
    assert measured["candidates_timed"] == 0 and measured["decision_seconds"] < 5
    assert all(
        evidence["reason"].startswith("no 16-bit dtype runs fast")
        for evidence in callback.plan.metadata["evidence"].values()
    )
    assert all(np.isfinite(history.history["loss"]))


def test_one_liner_with_a_named_gpu_profile_predicts_costs(classification, capsys):
    x, y = classification
    model = _compiled(build_mlp())
    callback = AutoPrecision(hardware="rtx2080ti", auto=AutoPlan(profile_steps=2))
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[callback])
    assert "bfloat16" not in callback.handle.dtypes.values()  # Turing: no fast bfloat16
    assert callback.plan.metadata["hardware"]


def test_tensorboard_dir_gets_loss_scale_dtype_counts_and_the_plan(mlp, classification, tmp_path):
    import tensorflow as tf

    x, y = classification
    _compiled(mlp)
    plan = PrecisionPlan.uniform(mlp, "float16").with_dtype("dense_2", "float32")
    mlp.fit(
        x,
        y,
        epochs=2,
        verbose=0,
        callbacks=[AutoPrecision(plan, tensorboard_dir=tmp_path / "logs", verbose=0)],
    )
    values: dict[str, list] = {}
    for event_file in (tmp_path / "logs" / "autoprec").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(event_file)):
            for value in event.summary.value:
                values.setdefault(value.tag, []).append(tf.make_ndarray(value.tensor))
    assert [float(v) for v in values["autoprec/loss_scale"]] == [32768.0, 32768.0]
    assert [int(v) for v in values["autoprec/layers_float16"]] == [3, 3]
    assert len(values["autoprec/plan"]) == 1  # written once: the plan did not change
    assert b"dense_2" in values["autoprec/plan"][0].item()


def test_one_liner_with_a_budget_runs_a_short_search_before_training(classification, capsys):
    x, y = classification
    model = _compiled(build_mlp())
    auto = AutoPlan(
        profile_steps=2,
        budget=autoprec.Budget("val_accuracy", max_drop=0.2),
        x=(x[:96], y[:96]),
        validation_data=(x[96:], y[96:]),
        n_trials=3,
    )
    callback = AutoPrecision(hardware="rtx4090", auto=auto)
    history = model.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[callback])
    assert callback.search_result is not None
    assert len(callback.search_result.study.trials) >= 1
    assert callback.plan.metadata["budget"]["metric"] == "val_accuracy"
    assert callback.handle is not None and np.isfinite(history.history["loss"][0])
    assert "automatic plan" in capsys.readouterr().out


def test_auto_settings_are_checked(mlp):
    budget = autoprec.Budget("val_loss", max_relative_drop=0.02)
    with pytest.raises(PlanError, match="budget= runs a search, which needs x= .*validation_data="):
        AutoPlan(budget=budget)
    with pytest.raises(PlanError, match="pass budget="):
        AutoPlan(x=(1, 2), validation_data=(3, 4))
    with pytest.raises(PlanError, match="budget must be an autoprec.Budget"):
        AutoPlan(budget="val_loss", x=(1, 2), validation_data=(3, 4))
    with pytest.raises(PlanError, match="profile_steps must be an integer >= 1, got 0"):
        AutoPlan(profile_steps=0)
    with pytest.raises(PlanError, match="batch_size must be an integer >= 1 or None"):
        AutoPlan(batch_size=-4)
    with pytest.raises(PlanError, match="without a plan"):
        AutoPrecision(PrecisionPlan.uniform(mlp, "float32"), auto=AutoPlan())
    with pytest.raises(PlanError, match="auto must be an autoprec.AutoPlan"):
        AutoPrecision(auto={"profile_steps": 2})


def test_arguments_after_the_plan_are_keyword_only_and_few():
    for callback in (AutoPrecision, autoprec.runtime.PlanCallback):
        parameters = list(inspect.signature(callback).parameters.values())
        assert len(parameters) <= 8
        assert parameters[0].name == "plan"
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[1:])
    with pytest.raises(TypeError):
        AutoPrecision(None, "local")


def test_config_objects_print_validate_and_round_trip():
    guard = Guard(on_nan="stop", history_steps=8, check_kernels=False)
    assert repr(guard).startswith("Guard(on_nan='stop', history_steps=8, near_binades=2.0")
    assert "check_kernels=False" in repr(guard) and "near_binades=2.0" in repr(guard)
    assert Guard.from_config(guard.get_config()) == guard
    with pytest.raises(AttributeError):
        guard.on_nan = "raise"  # frozen
    with pytest.raises(AutoprecError, match="on_nan='ignore' is not valid; use one of 'promote'"):
        Guard(on_nan="ignore")
    with pytest.raises(AutoprecError, match="history_steps must be an integer >= 1, got 0"):
        Guard(history_steps=0)
    with pytest.raises(AutoprecError, match="check_kernels must be True or False"):
        Guard(check_kernels="yes")
    with pytest.raises(AutoprecError, match="unknown field.*'guard_window'"):
        Guard.from_config({"guard_window": 3})

    scale = LossScale(initial=1024.0, floor=2.0, growth_steps=50)
    assert repr(scale) == "LossScale(initial=1024.0, floor=2.0, growth_steps=50, dynamic=True)"
    assert LossScale.from_config(scale.get_config()) == scale
    with pytest.raises(PlanError, match="floor 4096 is above initial 1024"):
        LossScale(initial=1024.0, floor=4096.0)
    with pytest.raises(PlanError, match="growth_steps must be an integer >= 1"):
        LossScale(growth_steps=0)

    auto = AutoPlan(profile_steps=4, batch_size=64)
    assert repr(auto) == (
        "AutoPlan(profile_steps=4, batch_size=64, budget=None, n_trials=20, timing_rounds=5, "
        "decision_seconds=None, remember=True)"
    )
    assert AutoPlan.from_config(auto.get_config()) == auto
    x = np.zeros((96, 8), "float32")
    searching = AutoPlan(
        budget=autoprec.Budget("val_loss", max_relative_drop=0.02),
        x=(x, x[:, 0]),
        validation_data=(x[:32], x[:32, 0]),
    )
    assert "x=(ndarray(96, 8), ndarray(96,))" in repr(searching)


def test_a_custom_loss_scale_and_a_guard_are_used_and_reusable(mlp, classification):
    x, y = classification
    _compiled(mlp)
    plan = PrecisionPlan.uniform(mlp, "float16")
    scale, guard = LossScale(initial=256.0, floor=4.0, growth_steps=7), Guard(check_kernels=False)
    callback = AutoPrecision(plan, loss_scale=scale, guard=guard, verbose=0)
    assert callback.guard is guard and callback.loss_scale is scale
    history = mlp.fit(x, y, epochs=1, verbose=0, callbacks=[callback])
    optimizer = mlp.optimizer
    assert history.history["loss_scale"] == [256.0]
    assert (optimizer.floor, int(optimizer.dynamic_growth_steps)) == (4.0, 7)
    assert callback.current_plan().metadata["loss_scale"]["floor"] == 4.0
    assert AutoPrecision(plan, loss_scale=scale, guard=guard).guard == Guard(check_kernels=False)
    with pytest.raises(PlanError, match="guard must be an autoprec.Guard or None"):
        AutoPrecision(plan, guard=True)


def test_a_plan_that_does_not_fit_says_how_to_apply_a_part_of_it(mlp, classification):
    x, y = classification
    _compiled(mlp)
    plan = PrecisionPlan({"dense": "bfloat16", "not_a_layer": "float16"})
    with pytest.raises(PlanError, match=r"apply_plan\(model, plan, strict=False\)"):
        mlp.fit(x, y, epochs=1, verbose=0, callbacks=[AutoPrecision(plan, verbose=0)])
    with pytest.warns(UserWarning, match="not_a_layer"):
        handle = autoprec.apply_plan(mlp, plan, strict=False)
    mlp.fit(x, y, epochs=1, verbose=0, callbacks=[AutoPrecision(handle.plan, verbose=0)])
    assert layer_paths(mlp)["dense"].compute_dtype == "bfloat16"


@pytest.mark.parametrize("batch_size", [8, 64])
def test_automatic_costs_are_for_the_batch_size_fit_uses(batch_size):
    x, y = classification_data(samples=100)  # 100 % 8 and 100 % 64: a partial last batch
    model = _compiled(build_mlp())
    callback = AutoPrecision(hardware="rtx4090", auto=AutoPlan(profile_steps=2), verbose=0)
    model.fit(x, y, epochs=1, batch_size=batch_size, verbose=0, callbacks=[callback])
    assert callback.estimate.batch_size == batch_size


def test_automatic_costs_batch_size_from_a_dataset_or_as_given():
    x, y = classification_data(samples=100)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(24)
    model = _compiled(build_mlp())
    callback = AutoPrecision(hardware="rtx4090", auto=AutoPlan(profile_steps=5), verbose=0)
    model.fit(dataset, epochs=1, shuffle=False, verbose=0, callbacks=[callback])  # 4 x 24, then 4
    assert callback.estimate.batch_size == 24
    model = _compiled(build_mlp())
    callback = AutoPrecision(
        hardware="rtx4090", auto=AutoPlan(profile_steps=1, batch_size=128), verbose=0
    )
    model.fit(x, y, epochs=1, batch_size=8, verbose=0, callbacks=[callback])
    assert callback.estimate.batch_size == 128


def test_messages_go_to_the_logger_when_keras_interactive_logging_is_off(
    mlp, classification, capsys, caplog
):
    x, y = classification
    _compiled(mlp)
    plan = PrecisionPlan.uniform(mlp, "float16").with_dtype("dense_2", "float32")
    keras.config.disable_interactive_logging()
    try:
        with caplog.at_level(logging.INFO, logger="autoprec"):
            mlp.fit(x, y, epochs=1, verbose=0, callbacks=[AutoPrecision(plan)])
    finally:
        keras.config.enable_interactive_logging()
    assert "autoprec: plan applied to 1 float32, 3 float16 layer(s)" in caplog.text
    assert "autoprec" not in capsys.readouterr().out
    mlp.fit(x, y, epochs=1, verbose=0, callbacks=[AutoPrecision(plan)])
    assert "autoprec: plan applied to" in capsys.readouterr().out
