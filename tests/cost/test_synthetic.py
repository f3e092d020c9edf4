"""Tests for autoprec.cost.synthetic: random tensors and arguments shaped like a recorded call."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from autoprec import cost
from autoprec.errors import BackendError
from autoprec.layers import layer_paths


def test_synthetic_arguments_rebuild_a_recorded_call(attention_model):
    trace = cost.trace_model(attention_model)
    call = trace.calls["attention"][0]
    args, kwargs = cost.synthetic_arguments(call, 3, "float32", np.random.default_rng(0))
    assert [tuple(arg.shape) for arg in args] == [(3, 8, 8)]
    assert tuple(kwargs["value"].shape) == (3, 8, 8)
    assert all(value is not None for value in kwargs.values())
    layer = layer_paths(attention_model)["attention"]
    assert tuple(layer(*args, **kwargs).shape) == (3, 8, 8)


def test_synthetic_arguments_keep_dtypes_values_and_lists():
    call = cost.LayerCall(
        path="merge",
        class_name="Concatenate",
        arguments=(
            (
                "inputs",
                (cost.TensorSpec((None, 4), "float32"), cost.TensorSpec((None, 2), "float32")),
            ),
            ("mask", cost.TensorSpec((None, 4), "bool")),
            ("ids", cost.TensorSpec((None, 5), "int32")),
            ("axis", -1),
            ("unused", None),
        ),
        outputs=(cost.TensorSpec((None, 6), "float32"),),
    )
    args, kwargs = cost.synthetic_arguments(call, 2, "bfloat16", np.random.default_rng(0))
    assert [tuple(tensor.shape) for tensor in args[0]] == [(2, 4), (2, 2)]
    assert all(keras.backend.standardize_dtype(tensor.dtype) == "bfloat16" for tensor in args[0])
    assert keras.ops.convert_to_numpy(kwargs["mask"]).all()
    assert not keras.ops.convert_to_numpy(kwargs["ids"]).any()
    assert keras.backend.standardize_dtype(kwargs["ids"].dtype) == "int32"
    assert kwargs["axis"] == -1 and "unused" not in kwargs


def test_synthetic_tensor_draws_from_rng_or_value_range():
    spec = cost.TensorSpec((None, 64), "float32")
    first = cost.synthetic_tensor(spec, 4, "float32", np.random.default_rng(1))
    again = cost.synthetic_tensor(spec, 4, "float32", np.random.default_rng(1))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(first), keras.ops.convert_to_numpy(again)
    )
    assert keras.ops.convert_to_numpy(first).min() < 0
    positive = keras.ops.convert_to_numpy(
        cost.synthetic_tensor(spec, 4, "float16", np.random.default_rng(1), value_range=(0.5, 1.5))
    )
    assert positive.shape == (4, 64) and positive.dtype == np.float16
    assert 0.5 <= positive.min() and positive.max() <= 1.5


def test_synthetic_arguments_name_the_argument_that_cannot_be_rebuilt():
    class TakesAnObject(keras.layers.Layer):
        def call(self, inputs, options=None):
            return inputs

    inputs = keras.Input((4,))
    model = keras.Model(inputs, TakesAnObject()(inputs, options=object()))
    trace = cost.trace_model(model)
    path = next(path for path, calls in trace.calls.items() if calls and path != "input_layer")
    with pytest.raises(BackendError, match="'options'"):
        cost.synthetic_arguments(trace.calls[path][0], 2, "float32", np.random.default_rng(0))
