"""A layer whose recording raises runs in float32: the profile marks it, the plans keep it in
float32 and the guard promotes it when nothing it recorded explains a failed step."""

from __future__ import annotations

import collections

import keras
import numpy as np

import autoprec
from autoprec import AutoPrecision, PrecisionPlan
from autoprec.callback import AutoPlan
from autoprec.layers import layer_paths

REASON = "recording raised"


class Halves(collections.namedtuple("Halves", "low high")):
    """A namedtuple its values cannot be repacked into (its constructor wants a keyword)."""

    def __new__(cls, low, high, *, checked):
        return super().__new__(cls, low, high)


class Split(keras.layers.Layer):
    """Returns its inputs scaled twice, as `Halves`: recording its outputs raises."""

    def __init__(self, gain: float = 2.0, **kwargs):
        super().__init__(**kwargs)
        self.gain = gain

    def call(self, inputs):
        return Halves(inputs * 0.5, inputs * self.gain, checked=True)

    def compute_output_spec(self, inputs):
        spec = keras.KerasTensor(inputs.shape, inputs.dtype)
        return Halves(spec, spec, checked=True)


class SplitNet(keras.Model):
    def __init__(self, gain: float = 2.0, width: int = 8):
        super().__init__(name="split_net")
        self.first = keras.layers.Dense(width, name="first")
        self.split = Split(gain, name="split")
        self.head = keras.layers.Dense(3, name="head")

    def call(self, inputs):
        halves = self.split(self.first(inputs))
        return self.head(halves.low + halves.high)


def _model(gain: float = 2.0, width: int = 8) -> SplitNet:
    model = SplitNet(gain, width)
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def _data(samples: int = 64, features: int = 8):
    x = np.random.default_rng(0).standard_normal((samples, features)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32")


def test_the_one_liner_keeps_a_layer_it_cannot_record_in_float32_and_says_why():
    model = _model(width=2048)  # wide enough for 16-bit to be predicted faster
    x, y = _data(samples=1024, features=1024)
    callback = AutoPrecision(hardware="rtx4090", auto=AutoPlan(profile_steps=1), verbose=0)
    history = model.fit(x, y, batch_size=512, epochs=1, verbose=0, callbacks=[callback])
    assert np.isfinite(history.history["loss"]).all()
    assert callback.profile.unrecorded == ("split",)
    assert callback.plan.dtype_for("split") == "float32"
    assert callback.plan.dtype_for("first") == "bfloat16"  # the others still take 16-bit
    evidence = callback.plan.metadata["evidence"]["split"]
    assert evidence["kind"] == "budget" and REASON in evidence["reason"]
    assert layer_paths(model)["split"].compute_dtype == "float32"


def test_a_saved_profile_keeps_the_layers_it_could_not_record(tmp_path):
    model = _model()
    x, y = _data()
    model.fit(x, y, batch_size=16, verbose=0)
    profile = autoprec.profile(model, (x, y), steps=2, verbose=0)
    loaded = autoprec.Profile.load(profile.save(tmp_path / "profile.json"))
    assert loaded.unrecorded == ("split",) and "split" not in loaded.layers
    plan = autoprec.heuristic_plan(model, profile=loaded, hardware="rtx4090")
    assert plan.dtype_for("split") == "float32" and plan.dtype_for("head") != "float32"
    assert REASON in plan.metadata["evidence"]["split"]["reason"]


def test_the_guard_promotes_the_16_bit_layer_it_cannot_record_when_nothing_else_explains_a_step():
    # `split` (float16) overflows in its backward pass only, scaling the loss-scaled
    # gradients by 1000: no layer the replay records shows it.
    model = _model(gain=1e3)
    x, y = _data()
    plan = PrecisionPlan.uniform(model, "float32").with_dtype("split", "float16")
    callback = AutoPrecision(plan, verbose=0)
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[callback])
    promotions = [event for event in callback.plan.events if event["kind"] == "promotion"]
    assert [event["layer"] for event in promotions] == ["split"], callback.plan.events
    assert "could not be recorded" in promotions[0]["evidence"]
    assert layer_paths(model)["split"].compute_dtype != "float16"
    assert np.isfinite(history.history["loss"][-1])
