"""Tests for autoprec.profiler.layout: the names a profile uses and the shapes of its values."""

from __future__ import annotations

import dataclasses

from profiler.reference import synthetic_profile

from autoprec import numerics
from autoprec.profiler import Float8Ranges, Float8TensorRange, stats
from autoprec.profiler.layout import (
    ATTENTION_LOGITS,
    FLOAT8_FORMAT_NAMES,
    FLOAT8_TENSORS,
    OUTPUT_KEY,
    ROOT_PATH,
    TENSOR_KINDS,
    Float8RangesView,
    Float8RangeView,
    LayerView,
    ProfileView,
    StatsView,
)


def test_the_values_have_the_shapes_merging_and_the_json_read():
    prof = synthetic_profile()
    assert isinstance(prof, ProfileView)
    for layer in prof.layers.values():
        assert isinstance(layer, LayerView)
        for kind in TENSOR_KINDS:
            assert all(isinstance(item, StatsView) for item in getattr(layer, kind).values())
    item = Float8TensorRange("float8_e4m3fn", 2.0, 100, 0, 0.0, 0.0, 1.1, 8)
    assert isinstance(item, Float8RangeView)
    assert isinstance(Float8Ranges(kernel=item), Float8RangesView)
    assert not isinstance(item, StatsView) and not isinstance(prof, LayerView)


def test_the_tensor_kinds_are_the_layer_profile_groups():
    fields = [field.name for field in dataclasses.fields(stats.LayerProfile)]
    assert [name for name in fields if name in TENSOR_KINDS] == list(TENSOR_KINDS)
    assert (OUTPUT_KEY, ATTENTION_LOGITS, ROOT_PATH) == ("output", "attention_logits", "<model>")


def test_float8_tensors_are_the_float8_ranges_fields_with_their_formats():
    assert list(FLOAT8_TENSORS) == [field.name for field in dataclasses.fields(Float8Ranges)]
    assert {fmt for fmt, _ in FLOAT8_TENSORS.values()} == set(FLOAT8_FORMAT_NAMES)
    assert FLOAT8_TENSORS["output_gradients"][0] == numerics.FLOAT8_E5M2.name
    assert FLOAT8_FORMAT_NAMES[numerics.FLOAT8_E4M3.name] == "E4M3"


def test_the_names_stay_importable_from_stats():
    # docs/api.md names these as autoprec.profiler.stats.<name>.
    assert stats.FLOAT8_TENSORS is FLOAT8_TENSORS and stats.TENSOR_KINDS is TENSOR_KINDS
    assert (stats.OUTPUT_KEY, stats.ATTENTION_LOGITS) == (OUTPUT_KEY, ATTENTION_LOGITS)
    assert stats.Float8Ranges is Float8Ranges and stats.Float8TensorRange is Float8TensorRange
    assert stats.FORMAT_VERSION == 1
