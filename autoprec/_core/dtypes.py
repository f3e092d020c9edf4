"""Compute dtypes a plan may assign, the Keras policies that realise them, and the one widening ladder."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import PlanError

FLOAT32 = "float32"
BFLOAT16 = "bfloat16"
FLOAT16 = "float16"

#: Compute dtypes a plan may assign, widest first.
COMPUTE_DTYPES: tuple[str, ...] = (FLOAT32, BFLOAT16, FLOAT16)

#: Keras policy applied for each compute dtype. Variables always stay float32
#: (the master copy); plain "float16" set after build would silently compute
#: in float32, so only `mixed_*` policies are used.
POLICY_FOR_DTYPE: dict[str, str] = {
    FLOAT32: "float32",
    BFLOAT16: "mixed_bfloat16",
    FLOAT16: "mixed_float16",
}

_ALIASES = {
    "fp32": FLOAT32,
    "f32": FLOAT32,
    "float32": FLOAT32,
    "bf16": BFLOAT16,
    "bfloat16": BFLOAT16,
    "mixed_bfloat16": BFLOAT16,
    "fp16": FLOAT16,
    "f16": FLOAT16,
    "half": FLOAT16,
    "float16": FLOAT16,
    "mixed_float16": FLOAT16,
}


def canonical_dtype(value: object, where: str = "dtype") -> str:
    """Returns the canonical compute dtype name for `value`.

    Args:
        value: a dtype name such as `"float16"`, `"bf16"` or `"mixed_bfloat16"`.
        where: what is being parsed, named in the error message.

    Returns:
        One of `"float32"`, `"bfloat16"`, `"float16"`.

    Raises:
        PlanError: if `value` is not a known compute dtype.
    """
    if isinstance(value, str) and value.strip().lower() in _ALIASES:
        return _ALIASES[value.strip().lower()]
    raise PlanError(
        f"{where}: unknown dtype {value!r}; use one of {', '.join(COMPUTE_DTYPES)} "
        "(aliases: fp32, bf16, fp16, mixed_bfloat16, mixed_float16)."
    )


def dtype_of_policy(policy: object) -> str:
    """Returns the compute dtype of a Keras dtype policy (or policy name)."""
    compute_dtype = getattr(policy, "compute_dtype", policy)
    name = str(compute_dtype)
    if name in COMPUTE_DTYPES:
        return name
    return FLOAT32


#: The one widening ladder: a dtype that cannot run a layer falls back to the next.
#: float16 has precision but little range, bfloat16 the range of float32 with
#: little precision; float32 is the end of every fallback.
WIDENING_LADDER: tuple[str, ...] = (FLOAT16, BFLOAT16, FLOAT32)


def wider_dtypes(dtype: str) -> tuple[str, ...]:
    """Returns the dtypes wider than `dtype` on the widening ladder, nearest first.

    Args:
        dtype: a compute dtype (any alias `canonical_dtype` accepts).

    Returns:
        `("bfloat16", "float32")` for float16, `("float32",)` for bfloat16, `()` for float32.

    Example:

    ```python
    wider_dtypes("float16")  # ("bfloat16", "float32")
    ```
    """
    name = canonical_dtype(dtype)
    return WIDENING_LADDER[WIDENING_LADDER.index(name) + 1 :]


def widen(dtype: str, allowed: tuple[str, ...] | list[str] = COMPUTE_DTYPES) -> str:
    """Returns `dtype` if allowed, else the nearest wider dtype in `allowed` (float32 at the end).

    Args:
        dtype: the wanted compute dtype.
        allowed: the dtypes that may be used.

    Returns:
        The first of `dtype` and its wider dtypes that is in `allowed`, else `"float32"`.

    Example:

    ```python
    widen("float16", allowed=("float32", "bfloat16"))  # "bfloat16"
    ```
    """
    for candidate in (canonical_dtype(dtype), *wider_dtypes(dtype)):
        if candidate in allowed:
            return candidate
    return FLOAT32


def count_dtypes(dtypes: Iterable[str]) -> dict[str, int]:
    """Returns how many times each compute dtype occurs, for every dtype (widest first).

    Args:
        dtypes: compute dtype names, e.g. the values of a `{path: dtype}` mapping.

    Returns:
        `{"float32": n, "bfloat16": n, "float16": n}`.

    Example:

    ```python
    count_dtypes(["float16", "float32", "float16"])  # {"float32": 1, "bfloat16": 0, "float16": 2}
    ```
    """
    counts = dict.fromkeys(COMPUTE_DTYPES, 0)
    for dtype in dtypes:
        counts[canonical_dtype(dtype)] += 1
    return counts


def counts_text(counts: dict[str, int]) -> str:
    """Returns `"3 float32, 5 bfloat16"`: the non-zero counts of `count_dtypes`, widest first."""
    return ", ".join(f"{count} {dtype}" for dtype, count in counts.items() if count)


#: How search trials may train float16 layers (`SearchSettings.float16_trials`): decided per
#: device, with float16 kernels, or emulated (float32 math, float16 rounding).
FLOAT16_TRIALS = ("auto", "native", "emulated")
