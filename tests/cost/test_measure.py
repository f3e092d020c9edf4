"""Tests for autoprec.cost.measure: calibration of layers, casts and whole steps, and its cache."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from conftest import build_mlp

from autoprec import cost
from autoprec.errors import BackendError, PlanError
from autoprec.layers import layer_paths


def test_calibrate_measures_then_reuses_cache_and_invalidates_on_change(tmp_path):
    x = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    y = np.zeros((32,), dtype="int32")
    model = build_mlp()
    first = cost.calibrate(model, (x, y), repeats=2, cache_dir=tmp_path, verbose=0)
    assert first.source == "measured" and first.batch_size == 32
    assert first.stats["timed"] > 0 and first.stats["cached"] == 0
    assert first.stats["fallback"] == 0 and first.stats["model_step"] >= 1
    for path in ("dense", "dense_1", "dense_2"):
        assert all(first.layers[path].seconds[dtype] > 0 for dtype in ("float32", "float16"))
    est = cost.estimate(model, "float32", costs=first)
    assert est.float32_step_seconds == pytest.approx(first.measured_step_seconds, rel=1e-6)

    second = cost.calibrate(model, (x, y), repeats=2, cache_dir=tmp_path, verbose=0)
    assert second.stats["timed"] == 0 and second.stats["model_steps_timed"] == 0
    assert second.stats["cached"] == first.stats["timed"]
    assert second.layers["dense"].seconds == first.layers["dense"].seconds
    assert second.measured_step_seconds_by_dtype == first.measured_step_seconds_by_dtype

    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    hidden = keras.layers.Dropout(0.1)(hidden)
    hidden = keras.layers.Dense(24, activation="relu")(hidden)
    changed = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))
    third = cost.calibrate(
        changed, (x, y), repeats=2, cache_dir=tmp_path, verbose=0, measure_model_step=False
    )
    # dense is unchanged (cached); dense_1 and dense_2 see new shapes (timed again).
    assert third.stats["cached"] == 2 * 3
    assert third.stats["timed"] == 2 * 3


def test_calibrate_attention_model_subtracts_projections(tmp_path, attention_model):
    x = np.random.default_rng(0).normal(size=(16, 8, 8)).astype("float32")
    table = cost.calibrate(
        attention_model,
        x,
        dtypes=("float32", "bfloat16"),
        repeats=2,
        cache_dir=tmp_path,
        verbose=0,
        measure_model_step=False,
    )
    assert table.stats["fallback"] == 0
    assert set(table.layers["attention"].seconds) == {"float32", "bfloat16"}
    assert table.layers["attention"].seconds["float32"] > 0
    assert table.cast_seconds["bfloat16"]["per_element"] >= 0


class NeedsArgument(keras.layers.Layer):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def call(self, inputs):
        return inputs * self.scale


def test_layer_that_cannot_be_rebuilt_falls_back_to_prediction(tmp_path):
    inputs = keras.Input((8,))
    outputs = keras.layers.Dense(4)(NeedsArgument(2.0)(inputs))
    model = keras.Model(inputs, outputs)
    table = cost.calibrate(
        model,
        np.ones((8, 8), dtype="float32"),
        dtypes=("float32",),
        repeats=2,
        cache_dir=tmp_path,
        verbose=0,
        measure_model_step=False,
    )
    path = next(path for path, layer in layer_paths(model).items() if type(layer) is NeedsArgument)
    custom = table.layers[path]
    assert custom.source.startswith("predicted (fallback")
    assert custom.seconds["float32"] > 0
    assert table.layers["dense"].source == "measured"
    assert table.stats["fallback"] == 1


def test_measuring_on_an_unsupported_backend_names_the_supported_ones(monkeypatch, mlp):
    x = np.zeros((4, 8), dtype="float32")
    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    with pytest.raises(BackendError, match="tensorflow and jax") as raised:
        cost.calibrate(mlp, x, verbose=0, use_cache=False)
    assert "'torch'" in str(raised.value) and "predict_costs" in str(raised.value)


def test_a_list_batch_is_the_inputs_of_a_multi_input_model(tmp_path):
    first, second = keras.Input((4,)), keras.Input((6,))
    joined = keras.layers.Concatenate()([first, second])
    model = keras.Model([first, second], keras.layers.Dense(2)(joined))
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(8, 4)).astype("float32"), rng.normal(size=(8, 6)).astype("float32")]
    table = cost.calibrate(
        model, inputs, dtypes=("float32",), repeats=2, cache_dir=tmp_path, verbose=0
    )
    assert table.batch_size == 8 and table.stats["fallback"] == 0
    assert table.layers["dense"].seconds["float32"] > 0
    assert set(table.measured_step_seconds_by_dtype) == {"float32"}


def test_calibrate_times_a_keras_hub_bert_at_the_shapes_of_its_dict_batch(
    tmp_path, bert_classifier, bert_batch
):
    with pytest.raises(PlanError, match="unknown dimensions"):
        cost.sample_inputs(bert_classifier)  # token_ids, padding_mask, ...: (None, None)
    table = cost.calibrate(
        bert_classifier,
        bert_batch,
        dtypes=("float32", "bfloat16"),
        repeats=1,
        cache_dir=tmp_path,
        verbose=0,
        measure_model_step=["float32"],
    )
    assert table.batch_size == 16 and table.stats["fallback"] == 0
    assert table.stats["timed"] > 0 and table.stats["model_step"] == 1
    embedding = table.layers["bert_backbone/token_embedding"]
    dense = table.layers["bert_backbone/transformer_layer_0/feedforward_intermediate_dense"]
    assert embedding.source == "measured" and dense.source == "measured"
    assert all(dense.seconds[dtype] > 0 for dtype in ("float32", "bfloat16"))
    # 16 sequences of 32 tokens, width 64 -> 128: the dense layer's FLOPs are at those shapes.
    assert dense.forward_flops == pytest.approx(2 * 16 * 32 * 64 * 128, rel=0.05)
    est = cost.estimate(bert_classifier, "float32", costs=table)
    assert est.step_seconds == pytest.approx(table.measured_step_seconds, rel=1e-6)


def test_calibrate_times_nested_dict_and_list_inputs_with_a_dynamic_sequence(
    tmp_path, nested_model, nested_batch, list_model
):
    x, y = nested_batch
    nested = cost.calibrate(
        nested_model, (x, y), dtypes=("float32",), repeats=1, cache_dir=tmp_path, verbose=0
    )
    assert nested.batch_size == 8 and nested.stats["fallback"] == 0
    assert nested.stats["model_step"] == 1
    # The layer taking a dict is timed alone, on a dict of synthetic tensors.
    assert nested.layers["pair_sum"].source == "measured"
    assert nested.layers["embedding"].seconds["float32"] > 0
    listed = cost.calibrate(
        list_model,
        ([x["text"]["tokens"], x["text"]["features"]], y),
        dtypes=("float32",),
        repeats=1,
        cache_dir=tmp_path,
        verbose=0,
    )
    assert listed.stats["fallback"] == 0 and listed.stats["model_step"] == 1
    # The shared branch has the same signature in both models: its timings come from the cache.
    assert listed.stats["cached"] > 0
    assert listed.layers["embedding"].seconds == nested.layers["embedding"].seconds


def test_a_time_budget_stops_per_layer_timing_and_predicts_the_rest(tmp_path):
    model = build_mlp()
    x = np.random.default_rng(0).normal(size=(16, 8)).astype("float32")
    table = cost.calibrate(
        model, x, dtypes=["float32"], cache_dir=tmp_path, verbose=0, time_budget=0.0
    )
    assert table.stats["timed"] == 0 and table.stats["out_of_time"] >= 1
    assert all(
        record.source.startswith("predicted")
        for record in table.layers.values()
        if record.seconds["float32"]
    )
    # The whole steps were timed first: the table still matches the measured step.
    assert table.stats["model_step"] >= 1
    timed = cost.calibrate(model, x, dtypes=["float32"], cache_dir=tmp_path, verbose=0)
    assert timed.stats["timed"] >= 1 and timed.stats["out_of_time"] == 0
