"""float8 in the search: space, warm starts, trials with Keras' float8 numerics, the result plan."""

from __future__ import annotations

import numpy as np
import optuna
from search.search_models import fast, labelled

import autoprec
from autoprec.search import Budget, search
from autoprec.search.record import TrialRecord


def wide_encoder(classes: int = 4):
    """Wide Dense layers around attention: float8 pays for them on `rtx4090` at a large batch."""
    import keras

    inputs = keras.Input((16, 64))
    hidden = keras.layers.Dense(512, name="embed")(inputs)
    attended = keras.layers.MultiHeadAttention(4, 128, name="attention")(hidden, hidden)
    hidden = keras.layers.LayerNormalization(name="norm")(keras.layers.Add()([hidden, attended]))
    hidden = keras.layers.Dense(2048, activation="gelu", name="up")(hidden)
    hidden = keras.layers.Dense(512, name="down")(hidden)
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    outputs = keras.layers.Dense(classes, activation="softmax", name="head")(pooled)
    model = keras.Model(inputs, outputs, name="wide_encoder")
    model.compile(
        keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


def test_a_search_on_fp8_hardware_puts_wide_dense_layers_in_float8_and_keeps_the_head_out():
    model = wide_encoder()
    train, val = labelled(model, samples=256)
    weights = [np.array(w) for w in model.get_weights()]
    result = search(
        model,
        train,
        val,
        budget=Budget("val_loss", max_relative_drop=0.5),
        n_trials=4,
        **fast(dtypes=("float32", "bfloat16", "float8"), cost_batch_size=512, baseline=None),
    )
    plan = result.plan
    classes = {path: info.class_name for path, info in plan.layer_info.items()}
    for path, dtype in plan.resolve().items():
        if dtype == "float8":
            assert classes[path] in ("Dense", "EinsumDense"), path
    assert plan.resolve()["head"] != "float8"
    evidence = plan.metadata["evidence"]
    assert "float8" in evidence["up"]["allowed"]
    assert "float8" not in evidence["head"]["allowed"]
    assert "output layer" in evidence["head"]["removed"]["float8"]
    assert "float8" not in evidence["norm"]["allowed"]
    assert evidence["up"]["seconds"]["float8"] < evidence["up"]["seconds"]["bfloat16"]
    warm = {TrialRecord.from_trial(t).warm_start for t in result.study.trials}
    assert "uniform float8" in warm
    # Keras' global float8 (every Dense/EinsumDense, the head too) is judged as a finalist.
    assert "keras float8_from_mixed_bfloat16" in warm
    float8_trials = [
        t
        for t in result.study.trials
        if t.state == optuna.trial.TrialState.COMPLETE
        and "float8" in TrialRecord.from_trial(t).assignment.values()
    ]
    assert float8_trials  # trials trained with Keras' float8 numerics (emulated here)
    # The user's model is unchanged: no float8 policy, no scaling variable left trainable.
    assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))
    assert all(layer.dtype_policy.quantization_mode is None for layer in model.layers)
    assert len(model.trainable_variables) == len(weights)
    reloaded = autoprec.PrecisionPlan.from_json(plan.to_json())
    assert reloaded == plan
