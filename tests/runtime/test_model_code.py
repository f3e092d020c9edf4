"""Model code autoprec calls for its own use (configs, clones, traces) cannot stop a fit
(autoprec/_core/models.py `call_model_code`, autoprec/runtime/policy_map.py `own_config`)."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest

import autoprec
from autoprec._core.models import call_model_code, error_line
from autoprec.errors import PlanError


class BrokenConfig(keras.layers.Layer):
    """Holds a Dense; its `get_config` reads an attribute it never set (a keras-hub defect)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = keras.layers.Dense(8, activation="relu")

    def call(self, inputs):
        return self.inner(inputs)

    def get_config(self):
        return {**super().get_config(), "scale": self.never_set}


class NoClone(keras.layers.Dense):
    """A Dense that cannot be rebuilt from its config, so `clone_model` fails."""

    @classmethod
    def from_config(cls, config):
        raise ValueError("NoClone cannot be rebuilt from its config")


def _fit(layer: keras.layers.Layer, callback: autoprec.AutoPrecision, data) -> dict:
    x, y = data
    inputs = keras.Input((8,))
    outputs = keras.layers.Dense(3, activation="softmax")(layer(keras.layers.Dense(8)(inputs)))
    model = keras.Model(inputs, outputs, name=f"{layer.name}_model")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[callback]).history


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 8)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0).astype("int32")


def _warnings(caplog, text: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno >= logging.WARNING and text in record.getMessage()
    ]


def test_a_layer_whose_config_raises_warns_once_and_trains_on(data, caplog):
    caplog.set_level(logging.WARNING, logger="autoprec")
    callback = autoprec.AutoPrecision()
    history = _fit(BrokenConfig(name="broken_config_fit"), callback, data)
    assert np.all(np.isfinite(history["loss"])) and len(history["loss"]) == 2
    (warning,) = _warnings(caplog, "never_set")
    assert "broken_config_fit" in warning and "AttributeError" in warning
    assert "Keras cannot save this model" in warning


def test_a_layer_that_cannot_be_cloned_trains_on_under_a_search(data, caplog):
    caplog.set_level(logging.WARNING, logger="autoprec")
    x, y = data
    auto = autoprec.AutoPlan(
        profile_steps=2,
        budget=autoprec.Budget("val_accuracy", max_drop=0.5),
        x=(x[:96], y[:96]),
        validation_data=(x[96:], y[96:]),
        n_trials=2,
    )
    callback = autoprec.AutoPrecision(hardware="rtx4090", auto=auto)
    history = _fit(NoClone(8, name="no_clone_fit"), callback, data)
    assert np.all(np.isfinite(history["loss"])) and len(history["loss"]) == 2
    assert callback.handle is not None


def test_the_warning_quotes_the_line_of_a_keras_wrapped_error_that_says_what():
    layer = keras.layers.Dense(2, name="wrapped_error")
    with pytest.raises(Exception) as raised:
        layer(np.zeros((2, 3, 4, 5), "float32"), not_an_argument=1)
    line = error_line(raised.value)
    assert "Exception encountered" not in line and "not_an_argument" in line
    assert call_model_code(lambda: layer.get_config()["name"], layer="x", lost="y", fallback=None)


def test_autoprec_errors_still_raise():
    def refuse():
        raise PlanError("a plan the user gave")

    with pytest.raises(PlanError, match="a plan the user gave"):
        call_model_code(refuse, layer="model", lost="nothing", fallback=None)
