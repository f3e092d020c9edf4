"""The heuristic's float8 choices on FP8 hardware: shapes, profiled ranges, output heads."""

from __future__ import annotations

import keras
import numpy as np

import autoprec
from autoprec.cost import predict_costs


def mixed_width_model(features: int = 256) -> keras.Model:
    """A wide MLP block beside a narrow one and a head: float8 pays only for the wide matmuls."""
    inputs = keras.Input((32, features))
    wide = keras.layers.Dense(2048, activation="gelu", name="wide_up")(inputs)
    wide = keras.layers.Dense(1024, name="wide_down")(wide)
    narrow = keras.layers.Dense(48, activation="relu", name="narrow")(wide)
    odd = keras.layers.Dense(1000, name="odd_width")(narrow)  # 1000 is no multiple of 16
    pooled = keras.layers.GlobalAveragePooling1D()(odd)
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(pooled)
    model = keras.Model(inputs, outputs, name="mixed_width")
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def data(features: int = 256, outliers: bool = False, samples: int = 64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 32, features)).astype("float32")
    if outliers:
        x[..., :3] *= 1e4  # a few outlier features, as LLM activations have
    y = rng.integers(0, 10, size=(samples,)).astype("int32")
    return x, y


def heuristic(model, x, y):
    prof = autoprec.profile(model, (x, y), steps=6, batch_size=8, verbose=0)
    table = predict_costs(model, "rtx4090", batch_size=256, x=x[:2])
    return prof, table, autoprec.heuristic_plan(model, prof, costs=table, hardware="rtx4090")


def test_float8_goes_to_wide_layers_only_and_never_to_the_head():
    model = mixed_width_model()
    x, y = data()
    _, table, plan = heuristic(model, x, y)
    assert plan.layers["wide_down"] == "float8"  # K = 2048: the float8 matmuls pay
    assert plan.metadata["evidence"]["wide_down"]["kind"] == "float8"
    # K = 256: quantizing costs about what the float8 matmuls save; it is float8 only if faster.
    faster = table.layer_seconds("wide_up", "float8") < table.layer_seconds("wide_up", "bfloat16")
    assert (plan.layers["wide_up"] == "float8") == faster
    assert table.layer_seconds("narrow", "float8") > table.layer_seconds("narrow", "bfloat16")
    assert table.layer_seconds("odd_width", "float8") > table.layer_seconds("odd_width", "bfloat16")
    assert plan.layers["narrow"] != "float8" and plan.layers["odd_width"] != "float8"
    assert plan.layers["head"] != "float8"


def test_outlier_input_features_keep_their_layer_out_of_float8():
    model = mixed_width_model()
    x, y = data(outliers=True)
    prof, _, plan = heuristic(model, x, y)
    reason = prof.float8_unsafe_reasons["wide_up"]
    assert "inputs" in reason and "E4M3" in reason
    assert plan.layers["wide_up"] != "float8"


def test_without_fp8_hardware_nothing_is_float8():
    model = mixed_width_model()
    x, y = data()
    table = predict_costs(model, "rtx3090", batch_size=256, x=x[:2])
    plan = autoprec.heuristic_plan(model, costs=table, hardware="rtx3090")
    assert "float8" not in plan.resolve().values()
    assert table.layer_seconds("wide_up", "float8") is None
