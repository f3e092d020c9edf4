"""bench/uniform_first.py: per-layer plans against Keras' global policy, on small models."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import keras
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(
        "uniform_first", ROOT / "bench" / "uniform_first.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model() -> keras.Model:
    inputs = keras.Input((64, 256))
    hidden = keras.layers.LayerNormalization()(keras.layers.Dense(64)(inputs))  # the hot layer
    hidden = keras.layers.Dense(2048, activation="gelu")(hidden)
    hidden = keras.layers.Dense(1024)(hidden)
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    model = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(pooled))
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def _sample(batch: int) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(batch, 64, 256)).astype("float32")


def test_predicted_rows_never_lose_to_a_uniform_policy_and_float8_pays_where_wide():
    bench = _bench()
    rows = bench.predicted_rows("wide", _model, _sample, (16, 512), ("rtx2080ti", "rtx4090"))
    assert len(rows) == 4 and all(row["ratio"] >= 1.0 - 1e-9 for row in rows)
    wide = [row for row in rows if row["card"] == "rtx4090" and row["batch"] == 512][0]
    assert "float8" in wide["plan"] and wide["ratio"] > 1.0


def test_a_hot_layer_rules_float16_out_and_the_plan_still_beats_float32():
    bench = _bench()
    (row,) = bench.unsafe_rows("wide", _model, _sample, (512,))
    assert row["unsafe_layers"] >= 1 and "float32" in row["plan"]
    assert row["ratio_to_float32"] > 1.1
