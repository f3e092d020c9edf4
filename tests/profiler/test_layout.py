"""Tests for autoprec.profiler.profile_json: the names a profile uses."""

from __future__ import annotations

import dataclasses

from autoprec import numerics
from autoprec.profiler import Float8Ranges, Float8TensorRange, stats
from autoprec.profiler.profile_json import (
    ATTENTION_LOGITS,
    FLOAT8_FORMAT_NAMES,
    FLOAT8_TENSORS,
    OUTPUT_KEY,
    ROOT_PATH,
    TENSOR_KINDS,
)


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
