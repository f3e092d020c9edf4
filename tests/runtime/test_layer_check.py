"""Checks say what they know: mixed arithmetic, and calls the check cannot make (runtime/check.py, runtime/kernels.py)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from reload_checks import assert_same_outputs

import autoprec
from autoprec.runtime.kernels import fallback_plan, find_missing_kernels


class Sampling(keras.layers.Layer):
    """The keras.io VAE layer: float32 noise drawn in `call`, added to its inputs."""

    def call(self, inputs):
        mean, log_var = inputs
        noise = keras.random.normal(keras.ops.shape(mean))
        return mean + keras.ops.exp(0.5 * log_var) * noise


class Scaled(keras.layers.Layer):
    """Takes a plain Python object the check cannot rebuild."""

    def call(self, inputs, scale=None):
        return inputs * keras.ops.cast(scale.value, inputs.dtype)


class _Scale:
    value = 2.0


def _fit_two_steps(model, plan, x, y):
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(
        x, y, batch_size=4, epochs=1, verbose=0, callbacks=[autoprec.AutoPrecision(plan, verbose=0)]
    )
    assert np.isfinite(history.history["loss"][0])


def test_a_vae_sampling_layer_runs_in_float32_because_its_own_arithmetic_mixes_dtypes(caplog):
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    mean = keras.layers.Dense(2, name="z_mean")(hidden)
    log_var = keras.layers.Dense(2, name="z_log_var")(hidden)
    z = Sampling(name="sampling")([mean, log_var])
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(z))
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16")
    found = find_missing_kernels(model, plan.resolve())
    assert [(item.path, item.kind, item.fallback) for item in found] == [
        ("sampling", "mixed_arithmetic", "float32")
    ]
    assert found[0].error.startswith(
        "its own arithmetic mixes float32 tensors it makes with bfloat16 ones: "
    )
    with caplog.at_level("WARNING", logger="autoprec"):
        fallen = fallback_plan(plan, found)
    assert "sampling cannot run in bfloat16 as planned" in caplog.text
    assert fallen.resolve()["sampling"] == "float32" and fallen.resolve()["hidden"] == "bfloat16"
    assert fallen.events[-1]["kind"] == "mixed_arithmetic"
    x = np.random.default_rng(0).normal(size=(8, 6)).astype("float32")
    _fit_two_steps(model, fallen, x, np.zeros((8, 1), "float32"))


def _bidirectional_lstm(wrapper: str, recurrent: str, cell: str):
    inputs = keras.Input((5,), dtype="int32")
    embedded = keras.layers.Embedding(10, 4, mask_zero=True, name="embedding")(inputs)
    lstm = keras.layers.LSTM(3, return_sequences=True)
    hidden = keras.layers.Bidirectional(lstm, name="bidirectional")(embedded)
    outputs = keras.layers.TimeDistributed(keras.layers.Dense(1), name="head")(hidden)
    model = keras.Model(inputs, outputs)
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16").with_dtype("bidirectional", wrapper)
    for side in ("forward_layer", "backward_layer"):
        plan = plan.with_dtype(f"bidirectional/{side}", recurrent)
        plan = plan.with_dtype(f"bidirectional/{side}/cell", cell)
    return model, plan, (8, 5), (8, 5, 1), "bidirectional/backward_layer/cell"


def _time_distributed_gru(wrapper: str, recurrent: str, cell: str):
    inputs = keras.Input((3, 5), dtype="int32")
    embedded = keras.layers.Embedding(10, 4, mask_zero=True, name="embedding")(inputs)
    hidden = keras.layers.TimeDistributed(keras.layers.GRU(3), name="sentences")(embedded)
    flat = keras.layers.Flatten(name="flatten")(hidden)  # ends the words' mask
    outputs = keras.layers.Dense(1, name="out")(flat)
    model = keras.Model(inputs, outputs)
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16").with_dtype("sentences", wrapper)
    plan = plan.with_dtype("sentences/layer", recurrent).with_dtype("sentences/layer/cell", cell)
    return model, plan, (8, 3, 5), (8, 1), "sentences/layer/cell"


@pytest.mark.parametrize("build", [_bidirectional_lstm, _time_distributed_gru])
@pytest.mark.parametrize(
    ("wrapper", "recurrent", "cell"),
    [
        ("float32", "float32", "float16"),
        ("float16", "float32", "bfloat16"),
        ("bfloat16", "float16", "float32"),
    ],
)
def test_a_masked_recurrent_layer_in_a_wrapper_trains_in_any_dtypes_and_reloads(
    build, wrapper, recurrent, cell, tmp_path
):
    # Keras casts each call's inputs, and the recurrent layer's masked select sees one
    # dtype: nothing moves, and what trained is what Keras rebuilds, cell dtype included.
    model, plan, x_shape, y_shape, cell_path = build(wrapper, recurrent, cell)
    assert find_missing_kernels(model, plan.resolve()) == []
    x = np.random.default_rng(0).integers(0, 10, size=x_shape).astype("int32")
    saved = tmp_path / "recurrent.keras"
    model.compile(optimizer="sgd", loss="mse")
    callback = autoprec.AutoPrecision(plan, verbose=0)
    model.fit(
        x,
        np.zeros(y_shape, "float32"),
        batch_size=4,
        verbose=0,
        callbacks=[callback, keras.callbacks.ModelCheckpoint(saved)],
    )
    assert callback.plan.resolve()[cell_path] == cell
    reloaded = keras.models.load_model(saved)
    trained = sorted(layer.compute_dtype for layer in model._flatten_layers())
    assert sorted(layer.compute_dtype for layer in reloaded._flatten_layers()) == trained
    assert_same_outputs(model, reloaded, x)


def test_a_layer_the_check_cannot_call_alone_is_said_so_and_keeps_its_dtype(caplog):
    inputs = keras.Input((4,))
    scaled = Scaled(name="scaled")(keras.layers.Dense(4, name="dense")(inputs), scale=_Scale())
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(scaled))
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16")
    with caplog.at_level("INFO", logger="autoprec"):
        found = find_missing_kernels(model, plan.resolve())
    assert [(item.path, item.kind, item.fallback) for item in found] == [
        ("scaled", "check_failed", "bfloat16")
    ]
    assert "kernel check could not call scaled alone (" in caplog.text
    assert "its dtype is unchanged" in caplog.text
    assert fallback_plan(plan, found) == plan and not fallback_plan(plan, found).events
