"""`autoprec.demo`: the demo models and the data generated for them."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from autoprec import demo as model


def test_pressure_data_needs_float32_at_the_head_and_overflows_float16_at_the_input():
    x, y = model.make_pressure_data(256)
    assert x.shape == (256, 64, 16) and y.shape == (256, 1)
    assert np.abs(x).max() > np.finfo(np.float16).max  # raw counts: inf in float16
    assert 1000 < y.mean() < 1030 and 1.0 < y.std() < 6.0
    # bfloat16 spaces its values 4 hPa (8 above 1024) apart here: the signal is lost.
    rounded = y.astype(ml_dtypes.bfloat16).astype("float32")
    assert np.mean((rounded - y) ** 2) > 0.5


def test_pressure_data_is_seeded_and_its_read_out_fixed():
    x, y = model.make_pressure_data(8, seed=3)
    again_x, again_y = model.make_pressure_data(8, seed=3)
    assert np.array_equal(x, again_x) and np.array_equal(y, again_y)
    assert not np.array_equal(x, model.make_pressure_data(8, seed=4)[0])


def test_the_pressure_model_has_the_layers_the_demo_explains():
    regressor = model.build_pressure_model()
    names = [layer.name for layer in regressor.layers]
    assert regressor.name == "autoprec_demo"
    assert names[1:] == ["sensor_proj", "sensor_norm", "smooth", "pool", "flat"] + [
        "wide_1",
        "wide_2",
        "wide_3",
        "narrow",
        "head",
    ]
    assert regressor.get_layer("wide_1").units == 1024
    assert float(regressor.get_layer("head").bias.numpy()[0]) == 1013.25
    assert regressor.output_shape == (None, 1) and regressor.compiled


def test_the_tutorial_classifier_and_its_data():
    x, y = model.make_data(64)
    assert x.shape == (64, 256) and x.dtype == np.float32 and np.abs(x).max() < 40000
    assert y.dtype == np.int32 and set(np.unique(y)) <= set(range(10))
    classifier = model.build_model()
    assert classifier.output_shape == (None, 10) and classifier.compiled
    assert [layer.name for layer in classifier.layers][1:] == [
        "sensor_proj",
        "sensor_norm",
        "wide_1",
        "wide_2",
        "narrow",
        "head",
    ]
