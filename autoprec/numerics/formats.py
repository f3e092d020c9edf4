"""Floating-point format facts: range limits of each format, read from `ml_dtypes.finfo`."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from types import MappingProxyType

import ml_dtypes
import numpy as np

#: Other names accepted for formats: the float8 names Keras' float8 path uses.
FORMAT_ALIASES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


@dataclasses.dataclass(frozen=True)
class FloatFormat:
    """Range facts of one floating-point format, taken from `ml_dtypes.finfo`."""

    name: str
    max: float
    min_normal: float
    min_subnormal: float
    eps: float
    max_exponent: int
    min_normal_exponent: int
    min_subnormal_exponent: int
    mantissa_bits: int


@functools.cache
def float_format(name: str) -> FloatFormat:
    """Returns the range facts of a float format, read from `ml_dtypes.finfo`."""
    name = FORMAT_ALIASES.get(name, name)
    info = ml_dtypes.finfo(name)
    maximum = float(info.max)
    min_normal = float(info.smallest_normal)
    min_subnormal = float(info.smallest_subnormal)
    return FloatFormat(
        name=name,
        max=maximum,
        min_normal=min_normal,
        min_subnormal=min_subnormal,
        eps=float(info.eps),
        max_exponent=math.frexp(maximum)[1] - 1,
        min_normal_exponent=math.frexp(min_normal)[1] - 1,
        min_subnormal_exponent=math.frexp(min_subnormal)[1] - 1,
        mantissa_bits=int(info.nmant),
    )


FLOAT16 = float_format("float16")
BFLOAT16 = float_format("bfloat16")
FLOAT32 = float_format("float32")
#: Keras' float8 format of inputs and kernels: max 448, smallest subnormal 2^-9.
FLOAT8_E4M3 = float_format("float8_e4m3fn")
#: Keras' float8 format of output gradients: max 57344, smallest subnormal 2^-16.
FLOAT8_E5M2 = float_format("float8_e5m2")

#: The dtype names a layer can compute in, besides float8 (which only some layers take).
COMPUTE_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")

#: The range facts of each compute dtype by name, e.g. `COMPUTE_FORMATS["float16"].max`
#: (65504), `.min_normal` (2^-14) and `.min_subnormal` (2^-24); read-only.
COMPUTE_FORMATS: Mapping[str, FloatFormat] = MappingProxyType(
    {name: float_format(name) for name in COMPUTE_DTYPES}
)


def format_for(dtype: str | FloatFormat | np.dtype | type) -> FloatFormat:
    """Returns the `FloatFormat` for a format, a format name (`"e4m3"` too) or a NumPy dtype."""
    if isinstance(dtype, FloatFormat):
        return dtype
    if isinstance(dtype, str):
        return float_format(dtype)
    try:
        return float_format(np.dtype(dtype).name)
    except TypeError:
        return float_format(str(dtype))
