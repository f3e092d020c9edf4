"""Keras' own callbacks beside `AutoPrecision`: one real training run per callback."""

from __future__ import annotations

import csv
import math
import warnings

import keras
import numpy as np
import pytest

import autoprec
from autoprec import PrecisionPlan
from autoprec.layers import layer_paths


def overflowing_cnn() -> keras.Model:
    """A conv stack whose `conv_big` outputs ~1e6 on the data below: float16 overflows at once."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, padding="same", name="conv_small"),
            keras.layers.Conv2D(4, 3, padding="same", name="conv_big"),
            keras.layers.GlobalAveragePooling2D(name="pool"),
            keras.layers.Dense(2, name="head"),
        ],
        name="overflowing_cnn",
    )
    small = model.get_layer("conv_small")
    small.set_weights([np.full_like(small.get_weights()[0], 0.1), small.get_weights()[1]])
    big = model.get_layer("conv_big")
    big.set_weights([np.full_like(big.get_weights()[0], 50.0), big.get_weights()[1]])
    model.compile(
        optimizer=keras.optimizers.Adam(1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def cnn_data(samples: int = 64):
    rng = np.random.default_rng(0)
    x = np.abs(rng.normal(size=(samples, 8, 8, 1))).astype("float32") * 100.0
    return x, (x.mean(axis=(1, 2, 3)) > 80).astype("int32")


def float16_plan(model: keras.Model) -> PrecisionPlan:
    return PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")


def small_mlp(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu", name="hidden"),
            keras.layers.Dense(3, name="head"),
        ],
        name="small_mlp",
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def mlp_data(samples: int = 64):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(samples, 8)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32") + (x[:, 1] > 1).astype("int32")


def test_terminate_on_nan_lets_a_rescued_run_finish_with_finite_epoch_logs():
    model = overflowing_cnn()
    x, y = cnn_data()
    callback = autoprec.AutoPrecision(float16_plan(model), verbose=0)
    history = model.fit(
        x,
        y,
        batch_size=16,
        epochs=3,
        verbose=0,
        callbacks=[keras.callbacks.TerminateOnNaN(), callback],
    )
    assert len(history.history["loss"]) == 3  # not terminated
    assert all(math.isfinite(loss) for loss in history.history["loss"])
    assert history.history["skipped_steps"][0] >= 1  # the guard skipped the overflowing step
    assert any(event["kind"] == "promotion" for event in callback.plan.events)
    assert all(np.isfinite(weight).all() for weight in model.get_weights())


def test_a_real_divergence_still_ends_training():
    model = small_mlp()
    model.compile(optimizer=keras.optimizers.SGD(1e4), loss="mse")
    x, _ = mlp_data()
    y = (x * 1e3).sum(axis=1, keepdims=True)
    history = model.fit(
        x,
        y,
        batch_size=8,
        epochs=20,
        verbose=0,
        callbacks=[
            autoprec.AutoPrecision(PrecisionPlan.uniform(model, "float32"), verbose=0),
            keras.callbacks.TerminateOnNaN(),
        ],
    )
    assert model.stop_training
    assert len(history.history.get("loss", [])) < 20


def test_early_stopping_stops_a_planned_run():
    model = small_mlp()
    x, y = mlp_data()
    stopper = keras.callbacks.EarlyStopping(monitor="loss", patience=1, min_delta=1e9)
    history = model.fit(
        x,
        y,
        epochs=10,
        verbose=0,
        callbacks=[autoprec.AutoPrecision(PrecisionPlan.uniform(model, "bfloat16")), stopper],
    )
    assert len(history.history["loss"]) == 2
    assert stopper.stopped_epoch == 1


def _no_skipped_loading():
    context = warnings.catch_warnings()
    context.__enter__()
    warnings.filterwarnings("error", message=".*Skipping variable loading.*")
    return context


def test_model_checkpoint_keras_file_reloads_optimizer_loss_scale_and_plan(tmp_path):
    model = overflowing_cnn()
    x, y = cnn_data()
    plan = float16_plan(model).with_dtype("conv_small", "bfloat16")
    path = tmp_path / "ck.keras"
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=2,
        verbose=0,
        callbacks=[
            autoprec.AutoPrecision(plan, verbose=0),
            keras.callbacks.ModelCheckpoint(path),
        ],
    )
    context = _no_skipped_loading()
    try:
        reloaded = keras.models.load_model(path)
        restored = autoprec.load_model(path)
    finally:
        context.__exit__(None, None, None)
    for loaded in (reloaded, restored):
        assert isinstance(loaded.optimizer, keras.optimizers.LossScaleOptimizer)
        assert int(loaded.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy())
        assert float(loaded.optimizer.dynamic_scale.numpy()) == float(
            model.optimizer.dynamic_scale.numpy()
        )
    dtypes = {path: layer.compute_dtype for path, layer in layer_paths(restored).items()}
    assert dtypes == {path: layer.compute_dtype for path, layer in layer_paths(model).items()}
    history = restored.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert math.isfinite(history.history["loss"][0])


def test_model_checkpoint_weights_only_resumes_the_same_weights(tmp_path):
    model = small_mlp()
    x, y = mlp_data()
    plan = PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    path = tmp_path / "ck.weights.h5"
    model.fit(
        x,
        y,
        epochs=2,
        verbose=0,
        callbacks=[
            autoprec.AutoPrecision(plan, verbose=0),
            keras.callbacks.ModelCheckpoint(path, save_weights_only=True),
        ],
    )
    fresh = small_mlp(seed=5)
    fresh.load_weights(path)
    for expected, actual in zip(model.get_weights(), fresh.get_weights()):
        np.testing.assert_array_equal(expected, actual)
    history = fresh.fit(
        x, y, epochs=1, verbose=0, callbacks=[autoprec.AutoPrecision(plan, verbose=0)]
    )
    assert math.isfinite(history.history["loss"][0])


class _StopAtEpoch(keras.callbacks.Callback):
    def __init__(self, epoch: int):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError("interrupted")


@pytest.mark.parametrize("backup_first", [True, False])
def test_backup_and_restore_resumes_with_optimizer_state(tmp_path, backup_first):
    x, y = mlp_data()
    backup = tmp_path / "backup"

    def callbacks(model, *extra):
        guard = autoprec.AutoPrecision(
            PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32"), verbose=0
        )
        restore = keras.callbacks.BackupAndRestore(backup)
        return [restore, guard, *extra] if backup_first else [guard, restore, *extra]

    model = small_mlp()
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(x, y, epochs=4, verbose=0, callbacks=callbacks(model, _StopAtEpoch(1)))
    steps_done = int(model.optimizer.iterations.numpy())

    resumed = small_mlp(seed=9)
    history = resumed.fit(x, y, epochs=4, verbose=0, callbacks=callbacks(resumed))
    assert len(history.history["loss"]) == 2  # epochs 3 and 4 only
    assert int(resumed.optimizer.iterations.numpy()) == 2 * steps_done
    assert isinstance(resumed.optimizer, keras.optimizers.LossScaleOptimizer)


def test_reduce_lr_on_plateau_reaches_the_wrapped_optimizer():
    model = small_mlp()
    x, y = mlp_data()
    reducer = keras.callbacks.ReduceLROnPlateau(
        monitor="loss", factor=0.5, patience=0, min_delta=1e9
    )
    model.fit(
        x,
        y,
        epochs=3,
        verbose=0,
        callbacks=[
            autoprec.AutoPrecision(PrecisionPlan.uniform(model, "float16"), verbose=0),
            reducer,
        ],
    )
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    reduced = float(model.optimizer.inner_optimizer.learning_rate.numpy())
    assert reduced == pytest.approx(1e-2 / 4)  # halved after epochs 2 and 3
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(reduced)


def test_csv_logger_and_tensorboard_record_every_epoch(tmp_path):
    model = overflowing_cnn()
    x, y = cnn_data()
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=2,
        verbose=0,
        callbacks=[
            autoprec.AutoPrecision(float16_plan(model), verbose=0),
            keras.callbacks.CSVLogger(tmp_path / "log.csv"),
            keras.callbacks.TensorBoard(tmp_path / "tb"),
        ],
    )
    with open(tmp_path / "log.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2
    assert all(math.isfinite(float(row["loss"])) for row in rows)
    assert "skipped_steps" in rows[0]
    assert list((tmp_path / "tb" / "train").iterdir())
