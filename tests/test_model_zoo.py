"""The main path on keras-hub models nobody here wrote: one-liner, search, guard, save and load.

Tiny configurations of four families (encoder, decoder, image transformer,
encoder-decoder), random weights and data made in the test; nothing is downloaded.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import zoo_models

import autoprec
from autoprec import AutoPlan, Budget, PrecisionPlan, SearchSettings
from autoprec.layers import layer_paths

pytest.importorskip("keras_hub")

FAMILIES = sorted(zoo_models.ZOO)
# Costs measured here for one family (dict inputs with dynamic dimensions), predicted for
# a card for the others (the suite's time).
HARDWARE = {"bert": "local", "bart": "rtx4090", "gpt2": "rtx3060", "vit": "rtx4090"}


def _default_run(*families: str) -> list:
    """All families, those not named marked slow (the default suite's time)."""
    return [
        family if family in families else pytest.param(family, marks=pytest.mark.slow)
        for family in FAMILIES
    ]


def _first(x, count: int):
    return keras.tree.map_structure(lambda value: value[:count], x)


def _split(x, y, at: int = 48):
    train = (keras.tree.map_structure(lambda v: v[:at], x), y[:at])
    val = (keras.tree.map_structure(lambda v: v[at:], x), y[at:])
    return train, val


@pytest.mark.parametrize("family", _default_run("bert"))
def test_one_liner_trains_and_its_checkpoint_reloads_whole(family, tmp_path):
    model, (x, y) = zoo_models.ZOO[family]()
    callback = autoprec.AutoPrecision(
        hardware=HARDWARE[family], auto=AutoPlan(profile_steps=4), verbose=0
    )
    path = tmp_path / "ck.keras"
    history = model.fit(
        x,
        y,
        batch_size=8,
        epochs=2,
        verbose=0,
        callbacks=[callback, keras.callbacks.ModelCheckpoint(path)],
    )
    assert all(math.isfinite(loss) for loss in history.history["loss"])
    plan = callback.current_plan()
    assert plan.layers  # the automatic mode decided every layer
    # keras-hub tasks compile themselves, so Keras restores no optimizer state for them
    # (with or without autoprec); the weights and the plan come back.
    restored = autoprec.load_model(path)
    expected = {p: layer.compute_dtype for p, layer in layer_paths(model).items()}
    assert {p: layer.compute_dtype for p, layer in layer_paths(restored).items()} == expected
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model.predict(_first(x, 4), verbose=0)),
        keras.ops.convert_to_numpy(restored.predict(_first(x, 4), verbose=0)),
        rtol=1e-5,
        atol=1e-5,
    )
    assert math.isfinite(restored.fit(x, y, batch_size=8, epochs=1, verbose=0).history["loss"][0])


def test_a_model_keras_cannot_save_trains_with_the_one_liner(caplog):
    """keras-hub 0.32's Llama decoder's `get_config` raises: plain `fit` trains, so must autoprec's."""
    model, (x, y) = zoo_models.llama_causal_lm()
    with pytest.raises(AttributeError, match="rope_scaling_factor"):
        model.backbone.transformer_layers[0].get_config()
    caplog.set_level("WARNING", logger="autoprec")
    callback = autoprec.AutoPrecision(hardware="rtx4090", verbose=0)
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
    assert all(math.isfinite(loss) for loss in history.history["loss"])
    assert callback.current_plan().layers
    warned = [r.getMessage() for r in caplog.records if "rope_scaling_factor" in r.getMessage()]
    assert warned and all("Keras cannot save this model" in message for message in warned)
    assert len(warned) == len(set(warned))  # once each


@pytest.mark.parametrize("family", _default_run("bart", "vit"))
def test_guard_rescues_a_float16_plan_whose_inputs_overflow(family):
    model, (x, y) = zoo_models.ZOO[family]()
    model(_first(x, 2))
    plan = PrecisionPlan.uniform(model, "float16")
    # The first projection's kernel scaled so that its outputs pass float16's 65504.
    first = next(
        layer
        for layer in layer_paths(model).values()
        if type(layer).__name__ in ("Dense", "EinsumDense", "Conv2D")
    )
    first.kernel.assign(keras.ops.convert_to_numpy(first.kernel) * 1e7)
    callback = autoprec.AutoPrecision(plan, verbose=0)
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
    kinds = {event["kind"] for event in callback.plan.events}
    assert kinds & {"promotion", "loss_scale", "skipped"}, callback.plan.events
    assert all(np.isfinite(weight).all() for weight in model.get_weights())
    assert "loss" in history.history


@pytest.mark.parametrize("family", _default_run("gpt2"))
def test_short_search_runs_every_trial(family):
    model, (x, y) = zoo_models.ZOO[family]()
    model(_first(x, 2))
    train, val = _split(x, y)
    result = autoprec.search(
        model,
        train,
        validation_data=val,
        budget=Budget("val_loss", max_drop=10.0),
        hardware="rtx3060",  # predicted costs: the suite's time
        n_trials=3,
        verbose=0,
        settings=SearchSettings(
            dtypes=["float32", "bfloat16"],
            steps_per_trial=2,
            batch_size=8,
            seed=0,
            baseline=None,  # random labels: the reference need not learn in 2 steps
        ),
    )
    failed = [trial for trial in result.study.trials if trial.state.name == "FAIL"]
    assert not failed, [trial.user_attrs for trial in failed]
    assert result.plan.layers
    model.fit(
        x, y, batch_size=8, epochs=1, verbose=0, callbacks=[autoprec.AutoPrecision(result.plan)]
    )
