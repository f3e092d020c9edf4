"""Tests for autoprec.numerics: format facts from ml_dtypes, names and aliases."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from autoprec import numerics


def test_format_facts_come_from_ml_dtypes():
    float16 = numerics.float_format("float16")
    assert float16.max == float(ml_dtypes.finfo("float16").max) == 65504.0
    assert float16.min_normal == 2.0**-14
    assert float16.min_subnormal == 2.0**-24
    assert float16.eps == 2.0**-10
    assert (float16.max_exponent, float16.min_normal_exponent) == (15, -14)
    assert float16.min_subnormal_exponent == -24
    bfloat16 = numerics.float_format("bfloat16")
    assert bfloat16.max == float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    assert (bfloat16.max_exponent, bfloat16.min_normal_exponent) == (127, -126)
    assert bfloat16.min_subnormal_exponent == -133
    assert bfloat16.eps == 2.0**-7


def test_float8_formats_come_from_ml_dtypes_and_take_short_names():
    for name, alias in (("float8_e4m3fn", "e4m3"), ("float8_e5m2", "e5m2")):
        info = ml_dtypes.finfo(name)
        fmt = numerics.float_format(alias)
        assert fmt == numerics.float_format(name) == numerics.format_for(alias)
        assert fmt.name == name and fmt.max == float(info.max)
        assert fmt.min_normal == float(info.smallest_normal)
        assert fmt.min_subnormal == float(info.smallest_subnormal)
        assert fmt.mantissa_bits == info.nmant
    e4m3, e5m2 = numerics.FLOAT8_E4M3, numerics.FLOAT8_E5M2
    assert (e4m3.max, e4m3.min_subnormal_exponent, e4m3.mantissa_bits) == (448.0, -9, 3)
    assert (e5m2.max, e5m2.min_subnormal_exponent, e5m2.mantissa_bits) == (57344.0, -16, 2)
    assert numerics.float_format("float16").mantissa_bits == 10


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32"])
def test_each_compute_dtype_has_its_limits_read_once(name):
    info = ml_dtypes.finfo(name)
    limits = numerics.float_format(name)
    assert limits is numerics.float_format(name) is numerics.format_for(name)
    assert limits.max == float(info.max)
    assert limits.min_normal == float(info.smallest_normal)
    assert limits.min_subnormal == float(info.smallest_subnormal)


def test_format_for_takes_formats_names_and_numpy_dtypes():
    assert numerics.format_for(numerics.FLOAT16) is numerics.FLOAT16
    assert numerics.format_for(np.float16) == numerics.FLOAT16
    assert numerics.format_for(np.dtype("float32")) == numerics.FLOAT32
    assert numerics.format_for(ml_dtypes.bfloat16) == numerics.BFLOAT16
