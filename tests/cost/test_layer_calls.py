"""Tests for autoprec.cost.layer_calls: recorded shapes and edges, sample inputs, and random
arguments shaped like a recorded call."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from autoprec import cost
from autoprec.errors import BackendError, PlanError
from autoprec.layers import layer_paths


def test_trace_records_shapes_edges_and_removes_hooks(mlp):
    sample = np.ones((3, 8), dtype="float32")
    before = mlp.predict(sample, verbose=0)
    trace = cost.trace_model(mlp)
    assert trace.calls["dense"][0].outputs[0].shape == (None, 16)
    assert cost.Edge(None, "dense", 8) in trace.edges
    # Dropout returns its input unchanged at inference: the tensor comes from dense or dropout.
    assert any(
        edge.consumer == "dense_1" and edge.producer in ("dense", "dropout") for edge in trace.edges
    )
    for layer in layer_paths(mlp).values():
        assert "call" not in vars(layer)
    np.testing.assert_allclose(mlp.predict(sample, verbose=0), before)


def test_sample_inputs_follow_the_structure_the_model_takes(mlp):
    assert cost.sample_inputs(mlp, 4).shape == (4, 8)
    tokens = keras.Input((5,), dtype="int32", name="tokens")
    mask = keras.Input((5,), dtype="bool", name="mask")
    features = keras.Input((5, 3), name="features")
    pooled = keras.layers.GlobalAveragePooling1D()(features)
    model = keras.Model({"text": {"tokens": tokens, "mask": mask}, "features": features}, pooled)
    sample = cost.sample_inputs(model, 3)
    assert set(sample) == {"text", "features"} and set(sample["text"]) == {"tokens", "mask"}
    assert sample["text"]["tokens"].shape == (3, 5) and sample["text"]["tokens"].dtype == "int32"
    assert not sample["text"]["tokens"].any() and sample["text"]["mask"].all()
    assert sample["features"].shape == (3, 5, 3) and sample["features"].dtype == "float32"
    assert tuple(model(sample).shape) == (3, 3)


def test_unknown_dimensions_need_a_batch_and_say_so(nested_model, list_model, bert_classifier):
    with pytest.raises(PlanError, match=r"'features' has unknown dimensions \(None, None, 4\)"):
        cost.sample_inputs(nested_model)
    with pytest.raises(PlanError, match=r"'tokens' has unknown dimensions \(None, None\)"):
        cost.sample_inputs(list_model)
    with pytest.raises(
        PlanError, match=r"unknown dimensions .*pass a batch of inputs \(`x=\.\.\.`\)"
    ):
        cost.trace_model(bert_classifier)
    specs = {"ids": [cost.TensorSpec((None, None), "int32")]}
    with pytest.raises(PlanError, match=r"""'x\["ids"\]\[0\]' has unknown dimensions"""):
        cost.random_inputs(specs, 2)


def test_random_inputs_build_any_nest_of_specs():
    specs = {
        "ids": cost.TensorSpec((None, 16), "int32"),
        "pair": [cost.TensorSpec((None, 4), "float16"), cost.TensorSpec((None,), "bool")],
    }
    arrays = cost.random_inputs(specs, 8)
    assert arrays["ids"].shape == (8, 16) and not arrays["ids"].any()
    assert arrays["pair"][0].shape == (8, 4) and arrays["pair"][0].dtype == np.float16
    assert arrays["pair"][1].shape == (8,) and arrays["pair"][1].all()
    np.testing.assert_array_equal(cost.random_inputs(specs, 8)["pair"][0], arrays["pair"][0])


def test_a_batch_with_a_dynamic_sequence_is_traced_at_its_own_length(nested_model, nested_batch):
    x, _ = nested_batch
    SEQUENCE = x["text"]["tokens"].shape[1]  # noqa: N806 - the batch's sequence length
    trace = cost.trace_model(nested_model, x)
    assert trace.calls["embedding"][0].outputs[0].shape == (None, SEQUENCE, 6)
    (call,) = trace.calls["pair_sum"]
    # The dict argument is recorded as a mapping and rebuilt as one.
    ((name, value),) = call.arguments
    assert name == "inputs" and isinstance(value, cost.MappingArgument)
    assert dict(value.items) == {
        "left": cost.TensorSpec((None, SEQUENCE, 6), "float32"),
        "right": cost.TensorSpec((None, SEQUENCE, 4), "float32"),
    }
    assert [spec.shape for spec in call.inputs] == [(None, SEQUENCE, 6), (None, SEQUENCE, 4)]
    assert call.signature()[0][1] == {
        "dict": [
            ["left", {"tensor": [[None, SEQUENCE, 6], "float32"]}],
            ["right", {"tensor": [[None, SEQUENCE, 4], "float32"]}],
        ]
    }
    args, kwargs = cost.synthetic_arguments(call, 3, "float32", np.random.default_rng(0))
    assert {key: tuple(tensor.shape) for key, tensor in args[0].items()} == {
        "left": (3, SEQUENCE, 6),
        "right": (3, SEQUENCE, 4),
    }
    layer = layer_paths(nested_model)["pair_sum"]
    assert tuple(layer(*args, **kwargs).shape) == (3, SEQUENCE, 6)
    # Edges from the model inputs: the tokens feed the embedding, the features the projection.
    assert cost.Edge(None, "embedding", SEQUENCE) in trace.edges
    assert cost.Edge(None, "pair_sum/projection", SEQUENCE * 4) in trace.edges


def test_a_list_input_is_traced_at_each_batch_s_own_length(list_model):
    rng = np.random.default_rng(0)
    for length in (5, 9):
        tokens = rng.integers(0, 50, (4, length)).astype("int32")
        features = rng.normal(size=(4, length, 4)).astype("float32")
        trace = cost.trace_model(list_model, [tokens, features])
        assert trace.calls["embedding"][0].outputs[0].shape == (None, length, 6)
        assert trace.calls["pool"][0].outputs[0].shape == (None, 6)


def test_a_model_is_traced_once_per_policies_and_batch_signature(mlp):
    mlp_trace = cost.trace_model(mlp)
    reads = cost.TRACES.reads
    assert cost.trace_model(mlp) is mlp_trace
    x = np.zeros((8, *mlp.inputs[0].shape[1:]), "float32")
    with_batch = cost.trace_model(mlp, x)
    assert cost.trace_model(mlp, x[:3]) is with_batch  # same signature: the batch size aside
    assert cost.TRACES.reads == reads + 1
    first = next(iter(layer_paths(mlp).values()))
    policy = first.dtype_policy
    try:
        first.dtype_policy = "mixed_bfloat16"
        retraced = cost.trace_model(mlp)
        assert retraced is not mlp_trace
        path = next(iter(layer_paths(mlp)))
        assert retraced.calls[path][0].outputs[0].dtype == "bfloat16"
    finally:
        first.dtype_policy = policy
    assert cost.trace_model(mlp) is mlp_trace


def test_the_batch_signature_drops_the_batch_and_keeps_shapes_and_dtypes():
    batch = {"ids": np.zeros((4, 7), "int32"), "x": np.zeros((4, 3, 2), "float32")}
    assert cost.batch_signature(batch) == (((7,), "int32"), ((3, 2), "float32"))
    assert cost.batch_signature(np.zeros((9, 7), "int32")) == cost.batch_signature(
        np.ones((2, 7), "int32")
    )
    assert cost.batch_signature(np.zeros((2, 8), "int32")) != cost.batch_signature(
        np.zeros((2, 7), "int32")
    )


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
