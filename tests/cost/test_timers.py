"""Tests for autoprec.cost.steps: one layer, one cast and an empty call timed for real."""

from __future__ import annotations

import math

import keras
import pytest

from autoprec import cost
from autoprec.cost import steps
from autoprec.errors import BackendError


def test_framework_versions_name_keras_the_backend_and_its_framework():
    versions = steps.framework_versions()
    assert versions["keras"] == keras.__version__
    assert versions["backend"] == keras.backend.backend()
    assert len(versions) > 2 and all(isinstance(value, str) for value in versions.values())


def test_measuring_backend_is_the_active_one_and_refuses_others(monkeypatch):
    backend = steps.measuring_backend("test")
    for name in ("layer_step", "empty_step", "cast_step", "versions", "to_device"):
        assert callable(getattr(backend, name))
    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    with pytest.raises(BackendError, match="test measures on the tensorflow and jax"):
        steps.measuring_backend("test")


def test_time_layer_times_a_copy_in_each_dtype_and_leaves_the_layer(mlp):
    call = cost.trace_model(mlp).calls["dense"][0]
    dense = mlp.get_layer("dense")
    weights = [weight.numpy().copy() for weight in dense.weights]
    for dtype in ("float32", "bfloat16"):
        seconds = steps.time_layer(dense, call, dtype, 16, 3, False)
        assert math.isfinite(seconds) and seconds > 0
    assert dense.dtype_policy.name == "float32"
    assert all((w == v.numpy()).all() for w, v in zip(weights, dense.weights))


def test_time_layer_raises_a_backend_error_for_a_layer_that_cannot_be_rebuilt(mlp):
    class NeedsScale(keras.layers.Layer):
        def __init__(self, scale):
            super().__init__()
            self.scale = scale

        def call(self, inputs):
            return inputs * self.scale

    call = cost.trace_model(mlp).calls["dense"][0]
    with pytest.raises(BackendError, match="'dense' \\(NeedsScale\\) cannot be rebuilt"):
        steps.time_layer(NeedsScale(2.0), call, "float32", 4, 2, False)


def test_time_cast_and_empty_function_return_positive_seconds():
    empty = steps.time_empty_function(3)
    cast = steps.time_cast("bfloat16", 1 << 16, 3)
    assert math.isfinite(empty) and empty > 0
    assert math.isfinite(cast) and cast > 0
    assert steps.SLOW_ROUNDS >= 1 and steps.SLOW_SECONDS > 0
