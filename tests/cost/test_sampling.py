"""Tests for autoprec.cost.measure's sampling: a few layers of each kind timed, the rest predicted from them."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from autoprec import cost
from autoprec.cost.measure import kind_scales, sample_kinds, scaled_seconds
from autoprec.cost.prediction import predicted_layer_seconds
from autoprec.hardware import get as get_hardware
from autoprec.hardware import resolve_hardware

DTYPES = ["float32", "bfloat16"]


def wide_mlp() -> keras.Model:
    """Five Dense layers of five sizes and one Conv1D: two kinds."""
    inputs = keras.Input((16, 8))
    hidden = keras.layers.Conv1D(8, 3, padding="same", name="conv")(inputs)
    for index, width in enumerate((64, 8, 128, 16, 32)):
        hidden = keras.layers.Dense(width, name=f"dense_{index}")(hidden)
    return keras.Model(inputs, hidden, name="wide")


def test_each_kind_is_sampled_from_its_most_expensive_layer_across_its_sizes():
    model = wide_mlp()
    counts = cost.count_costs(model)
    profile = get_hardware("cpu-generic")
    work = [path for path, count in counts.items() if not count.is_free]
    timed, predicted_from = sample_kinds(counts, work, 2, profile, 32)
    dense = sorted(
        (path for path in work if counts[path].class_name == "Dense"),
        key=lambda path: -predicted_layer_seconds(counts[path], profile, "float32", 32),
    )
    assert timed == {"conv", dense[0], dense[-1]}
    assert predicted_from == dict.fromkeys(dense[1:-1], "Dense")
    assert sample_kinds(counts, work, None, profile, 32) == (set(work), {})


def test_a_kinds_scale_carries_its_timed_layers_measured_over_predicted_seconds():
    model = wide_mlp()
    counts = cost.count_costs(model)
    profile = get_hardware("cpu-generic")
    predicted = predicted_layer_seconds(counts["dense_2"], profile, "bfloat16", 32)
    scales = kind_scales({"dense_2": {"bfloat16": 3 * predicted}}, counts, profile, 32)
    assert scales == {("Dense", "bfloat16"): pytest.approx(3.0)}
    seconds = scaled_seconds(counts["dense_1"], DTYPES, scales, profile, 32)
    expected = predicted_layer_seconds(counts["dense_1"], profile, "bfloat16", 32)
    assert seconds["bfloat16"] == pytest.approx(3 * expected)
    assert seconds["float32"] == predicted_layer_seconds(counts["dense_1"], profile, "float32", 32)


def test_calibrate_times_a_few_layers_a_kind_predicts_the_rest_and_reuses_the_cache(tmp_path):
    model = wide_mlp()
    x = np.random.default_rng(0).normal(size=(32, 16, 8)).astype("float32")
    settings = dict(dtypes=DTYPES, repeats=2, cache_dir=tmp_path, verbose=0)
    sampled = cost.calibrate(model, x, layers_per_kind=1, measure_model_step=False, **settings)
    assert sampled.stats["scaled"] == 4  # dense_* but the most expensive
    assert sampled.stats["timed"] == 2 * len(DTYPES)  # conv and one Dense, each dtype
    scaled = [path for path, record in sampled.layers.items() if "scaled" in record.source]
    timed = next(
        path
        for path, record in sampled.layers.items()
        if path.startswith("dense") and path not in scaled
    )
    profile = resolve_hardware("local")  # what calibrate predicts with by default
    counts = cost.count_costs(model)
    for dtype in DTYPES:
        ratio = sampled.layers[timed].seconds[dtype] / predicted_layer_seconds(
            counts[timed], profile, dtype, 32
        )
        for path in scaled:
            prediction = predicted_layer_seconds(counts[path], profile, dtype, 32)
            assert sampled.layers[path].seconds[dtype] == pytest.approx(ratio * prediction)
    # Every layer timed once, then every later sampled calibration reads them all.
    cost.calibrate(model, x, measure_model_step=False, **settings)
    reread = cost.calibrate(model, x, layers_per_kind=1, measure_model_step=False, **settings)
    assert reread.stats["scaled"] == 0 and reread.stats["timed"] == 0
    assert all(record.source in ("cached", "measured") for record in reread.layers.values())
