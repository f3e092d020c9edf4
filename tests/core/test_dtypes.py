"""Dtype names, the one widening ladder and dtype counts (autoprec/_core/dtypes.py)."""

from __future__ import annotations

import pytest

from autoprec._core import dtypes
from autoprec.errors import PlanError


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("fp16", "float16"),
        ("mixed_bfloat16", "bfloat16"),
        (" F32 ", "float32"),
        ("half", "float16"),
    ],
)
def test_aliases_resolve_to_canonical_names(alias, name):
    assert dtypes.canonical_dtype(alias) == name


def test_unknown_dtype_error_names_the_field_and_the_choices():
    with pytest.raises(PlanError, match=r"layers\['x'\]: unknown dtype 'int8'; use one of float32"):
        dtypes.canonical_dtype("int8", "layers['x']")


def test_the_ladder_widens_float16_to_bfloat16_to_float32():
    assert dtypes.wider_dtypes("float16") == ("bfloat16", "float32")
    assert dtypes.wider_dtypes("bf16") == ("float32",)
    assert dtypes.wider_dtypes("float32") == ()


@pytest.mark.parametrize(
    ("wanted", "allowed", "expected"),
    [
        ("float16", ("float32", "bfloat16", "float16"), "float16"),
        ("float16", ("float32", "bfloat16"), "bfloat16"),
        ("float16", ("float32",), "float32"),
        ("bfloat16", ("float32", "float16"), "float32"),
        ("float16", (), "float32"),
    ],
)
def test_widen_takes_the_nearest_allowed_dtype(wanted, allowed, expected):
    assert dtypes.widen(wanted, allowed) == expected


def test_counts_cover_every_dtype_widest_first():
    counts = dtypes.count_dtypes(["float16", "float32", "fp16"])
    assert list(counts) == ["float32", "bfloat16", "float16"]
    assert counts == {"float32": 1, "bfloat16": 0, "float16": 2}
    assert dtypes.counts_text(counts) == "1 float32, 2 float16"


def test_policy_dtype_of_keras_policies():
    import keras

    assert dtypes.dtype_of_policy(keras.DTypePolicy("mixed_float16")) == "float16"
    assert dtypes.dtype_of_policy("int8") == "float32"
