"""A subclassed model's own `call` under a plan: checked whole (autoprec/runtime/check.py)."""

from __future__ import annotations

import keras
import numpy as np

import autoprec
from autoprec.runtime.check import check_own_call, needs_own_call_check


class TwoBranches(keras.Model):
    """Adds two layers' outputs in its own `call`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.left = keras.layers.Dense(4)
        self.right = keras.layers.Dense(4)
        self.head = keras.layers.Dense(1)

    def call(self, inputs):
        return self.head(self.left(inputs) + self.right(inputs))


class AddsItsInput(keras.Model):
    """Adds its (float32) input to a layer's output in its own `call`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(4)

    def call(self, inputs):
        return inputs + self.dense(inputs)


def built(model: keras.Model) -> keras.Model:
    model(np.zeros((2, 4), "float32"))
    return model


def test_only_a_subclassed_model_with_more_than_one_dtype_needs_the_check():
    inputs = keras.Input((4,))
    functional = keras.Model(inputs, keras.layers.Dense(1, name="dense")(inputs))
    assert not needs_own_call_check(functional, {"dense": "bfloat16"})
    model = built(TwoBranches())
    assert not needs_own_call_check(model, dict.fromkeys(["left", "right", "head"], "float32"))
    assert needs_own_call_check(model, {"left": "bfloat16", "right": "bfloat16", "head": "float32"})


def test_dtypes_meeting_in_the_models_own_call_take_the_widest_planned_dtype_alike():
    model = built(TwoBranches())
    found = check_own_call(model, {"left": "float16", "right": "bfloat16", "head": "float16"})
    assert (found.kind, found.fallback) == ("mixed_arithmetic", "bfloat16")
    assert "the model's own call mixes dtypes" in found.error
    assert {layer.compute_dtype for layer in (model.left, model.right)} == {"float32"}  # put back
    assert check_own_call(model, dict.fromkeys(["left", "right", "head"], "bfloat16")) is None


def test_a_model_that_adds_its_float32_input_runs_in_float32():
    model = built(AddsItsInput())
    found = check_own_call(model, {"dense": "bfloat16"})
    assert (found.kind, found.fallback) == ("mixed_arithmetic", "float32")


def test_a_model_with_no_call_of_its_own_is_left_to_its_nested_models():
    class NoCall(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            inputs = keras.Input((4,))
            self.encoder = keras.Model(inputs, keras.layers.Dense(2, name="dense")(inputs))

    model = NoCall()
    assert check_own_call(model, {"encoder": "bfloat16", "encoder/dense": "float32"}) is None


def test_fit_trains_a_subclassed_model_whose_call_mixes_the_plans_dtypes():
    model = built(TwoBranches())
    model.compile(optimizer="sgd", loss="mse")
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16").with_dtype("left", "float16")
    callback = autoprec.AutoPrecision(plan, verbose=0)
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    history = model.fit(x, x[:, :1], batch_size=8, verbose=0, callbacks=[callback])
    assert np.isfinite(history.history["loss"]).all()
    assert {model.left.compute_dtype, model.right.compute_dtype} == {"bfloat16"}
    moved = [event for event in callback.plan.events if event["kind"] == "mixed_arithmetic"]
    assert {event["layer"] for event in moved} >= {"left"}
