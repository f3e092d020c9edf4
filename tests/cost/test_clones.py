"""Tests for autoprec.cost.steps: copies of a model with every layer, or each named one, in a dtype."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from autoprec import cost
from autoprec.errors import PlanError
from autoprec.layers import layer_paths


def test_clone_with_uniform_policy_copies_the_model_and_leaves_it_alone(mlp):
    assert not cost.clone_with_uniform_policy(mlp, "float16").compiled
    mlp.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    copy = cost.clone_with_uniform_policy(mlp, "bf16")
    # A compiled model's copy is compiled alike (keras.models.clone_model), with its own optimizer.
    assert copy is not mlp and copy.compiled and copy.optimizer is not mlp.optimizer
    assert [type(layer) for layer in copy.layers] == [type(layer) for layer in mlp.layers]
    assert {layer.dtype_policy.name for layer in layer_paths(copy).values()} == {"mixed_bfloat16"}
    assert {layer.dtype_policy.name for layer in layer_paths(mlp).values()} == {"float32"}
    x = np.ones((2, 8), dtype="float32")
    assert keras.backend.standardize_dtype(copy(x).dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(mlp(x).dtype) == "float32"
    float32 = cost.clone_with_uniform_policy(mlp, "float32")
    assert {layer.dtype_policy.name for layer in layer_paths(float32).values()} == {"float32"}
    float8 = cost.clone_with_uniform_policy(mlp, "float8")
    policies = {
        type(layer).__name__: layer.dtype_policy.name for layer in layer_paths(float8).values()
    }
    assert policies["Dense"] == "float8_from_mixed_bfloat16"
    assert policies["Dropout"] == "mixed_bfloat16"


def test_clone_with_policies_sets_the_named_layers_only_and_names_a_missing_one(mlp):
    path = next(path for path, layer in layer_paths(mlp).items() if layer.weights)
    copy = cost.clone_with_policies(mlp, {path: "f16"})
    assert layer_paths(copy)[path].dtype_policy.name == "mixed_float16"
    others = {p: layer for p, layer in layer_paths(copy).items() if p != path}
    assert {layer.dtype_policy.name for layer in others.values()} == {"float32"}
    assert layer_paths(mlp)[path].dtype_policy.name == "float32"
    with pytest.raises(PlanError, match="'nowhere' is not a layer"):
        cost.clone_with_policies(mlp, {"nowhere": "bfloat16"})


class _NoConfig(keras.layers.Layer):
    """A matrix product whose `get_config` raises, as some users' layers do."""

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], 32))

    def call(self, inputs):
        return keras.ops.matmul(inputs, self.kernel)

    def get_config(self):
        raise NotImplementedError("_NoConfig has no config")


def test_a_layer_that_cannot_be_copied_is_costed_by_prediction_with_one_warning(caplog):
    import logging

    from autoprec import AutoPrecision, estimate
    from autoprec.callback import AutoPlan

    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(32, activation="relu", name="hidden")(
        _NoConfig(name="no_config")(inputs)
    )
    model = keras.Model(inputs, keras.layers.Dense(4, name="head")(hidden), name="uncopyable")
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 16)).astype("float32"), rng.normal(size=(64, 4)).astype("float32")
    # A decision budget long enough to time the layers here: calibrate runs inside fit.
    callback = AutoPrecision(hardware="local", auto=AutoPlan(decision_seconds=120), verbose=0)
    with caplog.at_level(logging.WARNING, logger="autoprec"):
        history = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[callback])
        est = estimate(model, callback.plan, "local", batch_size=32, x=x[:32])
    assert np.isfinite(history.history["loss"]).all() and est.step_seconds > 0
    warned = [record.getMessage() for record in caplog.records]
    assert sum("no_config raised NotImplementedError" in line for line in warned) == 1
    assert any("costed by prediction" in line for line in warned)
    assert sum("uncopyable raised" in line for line in warned) == 1
    assert "cost model unavailable" not in caplog.text
    assert callback.estimate is not None and callback.estimate.source == "measured"
