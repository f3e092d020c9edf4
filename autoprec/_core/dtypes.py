"""Compute dtypes a plan may assign, the Keras policies that realise them, the widening ladder."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import PlanError

FLOAT32 = "float32"
BFLOAT16 = "bfloat16"
FLOAT16 = "float16"
FLOAT8 = "float8"

#: The 16/32-bit compute dtypes every floating-point layer may take, widest first.
COMPUTE_DTYPES: tuple[str, ...] = (FLOAT32, BFLOAT16, FLOAT16)

#: Every dtype a plan may name: the compute dtypes and float8 (Dense/EinsumDense only).
PLAN_DTYPES: tuple[str, ...] = (*COMPUTE_DTYPES, FLOAT8)

#: Layer classes with a float8 training path in Keras (`float8_from_*` policies).
FLOAT8_CLASSES: tuple[str, ...] = ("Dense", "EinsumDense")

#: The dtypes a float8 layer's non-matmul work may compute in (its policy's source).
FLOAT8_SOURCES: tuple[str, ...] = (BFLOAT16, FLOAT16, FLOAT32)

#: Keras policy of each compute dtype: `mixed_*`, whose variables stay float32 (a plain "float16"
#: set after build would silently compute in float32).
POLICY_FOR_DTYPE: dict[str, str] = {
    FLOAT32: "float32",
    BFLOAT16: "mixed_bfloat16",
    FLOAT16: "mixed_float16",
}

#: Every spelling `canonical_dtype` accepts, by the dtype it means.
_ALIASES = {
    alias: dtype
    for dtype, aliases in {
        FLOAT32: ("fp32", "f32", "float32"),
        BFLOAT16: ("bf16", "bfloat16", "mixed_bfloat16"),
        FLOAT16: ("fp16", "f16", "half", "float16", "mixed_float16"),
        FLOAT8: ("fp8", "f8", "float8", "float8_from_mixed_bfloat16"),
    }.items()
    for alias in aliases
}


def canonical_dtype(value: object, where: str = "dtype") -> str:
    """Returns the canonical compute dtype name for `value`."""
    if isinstance(value, str) and value.strip().lower() in _ALIASES:
        return _ALIASES[value.strip().lower()]
    raise PlanError(
        f"{where}: unknown dtype {value!r}; use one of {', '.join(PLAN_DTYPES)} "
        "(aliases: fp32, bf16, fp16, fp8, mixed_bfloat16, mixed_float16)."
    )


def canonical_float8_source(value: object, where: str = "float8_source") -> str:
    """Returns the dtype a float8 layer's non-matmul work computes in."""
    if value is None:
        return BFLOAT16
    dtype = canonical_dtype(value, where)
    if dtype not in FLOAT8_SOURCES:
        raise PlanError(
            f"{where}: {value!r} cannot be a float8 source; use one of {', '.join(FLOAT8_SOURCES)}."
        )
    return dtype


def policy_name(dtype: str, float8_source: str = BFLOAT16) -> str:
    """Returns the Keras dtype policy name that realises a plan dtype."""
    name = canonical_dtype(dtype)
    if name == FLOAT8:
        return f"float8_from_{POLICY_FOR_DTYPE[canonical_float8_source(float8_source)]}"
    return POLICY_FOR_DTYPE[name]


def is_float8_policy(policy: object) -> bool:
    """Returns whether a Keras dtype policy trains its layer's matrix products in float8."""
    return getattr(policy, "quantization_mode", None) == "float8"


def dtype_of_policy(policy: object) -> str:
    """Returns the plan dtype of a Keras dtype policy (or policy name)."""
    if is_float8_policy(policy) or policy == "float8" or str(policy).startswith("float8_from_"):
        return FLOAT8
    name = str(getattr(policy, "compute_dtype", policy))
    return name if name in COMPUTE_DTYPES else FLOAT32


def float8_eligible(class_name: str | None) -> bool:
    """Returns whether a layer class has a float8 training path in Keras (`FLOAT8_CLASSES`)."""
    return class_name in FLOAT8_CLASSES


#: The one widening ladder: a dtype that cannot run a layer falls back to the next (float16 has
#: precision but little range, bfloat16 float32's range with little precision).
WIDENING_LADDER: tuple[str, ...] = (FLOAT16, BFLOAT16, FLOAT32)


def wider_dtypes(dtype: str, float8_source: str = BFLOAT16) -> tuple[str, ...]:
    """Returns the dtypes wider than `dtype` on the widening ladder, nearest first."""
    name = canonical_dtype(dtype)
    if name == FLOAT8:
        source = canonical_float8_source(float8_source)
        return (source, *wider_dtypes(source))
    return WIDENING_LADDER[WIDENING_LADDER.index(name) + 1 :]


def widen(dtype: str, allowed: tuple[str, ...] | list[str] = PLAN_DTYPES) -> str:
    """Returns `dtype` if allowed, else the nearest wider dtype in `allowed` (float32 at the end)."""
    for candidate in (canonical_dtype(dtype), *wider_dtypes(dtype)):
        if candidate in allowed:
            return candidate
    return FLOAT32


def count_dtypes(dtypes: Iterable[str]) -> dict[str, int]:
    """Returns how many times each compute dtype occurs, for every dtype (widest first)."""
    counts = dict.fromkeys(PLAN_DTYPES, 0)
    for dtype in dtypes:
        counts[canonical_dtype(dtype)] += 1
    if not counts[FLOAT8]:
        del counts[FLOAT8]
    return counts


def counts_text(counts: dict[str, int]) -> str:
    """Returns `"3 float32, 5 bfloat16"`: the non-zero counts of `count_dtypes`, widest first."""
    return ", ".join(f"{count} {dtype}" for dtype, count in counts.items() if count)


#: How search trials may train float16 layers (`SearchSettings.float16_trials`): decided per
#: device, with float16 kernels, or emulated (float32 math, float16 rounding).
FLOAT16_TRIALS = ("auto", "native", "emulated")
