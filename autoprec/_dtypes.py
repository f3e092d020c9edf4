"""Compute dtypes a plan may assign, and the Keras policies that realise them."""

from __future__ import annotations

from .errors import PlanError

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
