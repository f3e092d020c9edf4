"""The one resolver of `hardware=`: profile names, JSON files, `"local"` and profile objects."""

from __future__ import annotations

import difflib
from pathlib import Path

from ..errors import HardwareError
from .builtin import BUILTIN, NORMALISED, normalise_name
from .detect import detect
from .profile import HardwareProfile, load_profile


def names() -> list[str]:
    """Returns the names of the built-in hardware profiles.

    Returns:
        Names accepted by `get`, GPUs first, e.g. `["rtx2060", ..., "cpu-generic"]`.

    Example:

    ```python
    "rtx4090" in autoprec.hardware.names()  # True
    ```
    """
    return list(BUILTIN)


def get(name: str) -> HardwareProfile:
    """Returns a built-in profile by name, ignoring case, spaces, `-` and `_`.

    A path to an existing `.json` file loads a user profile instead, and
    `"local"` detects this device.

    Args:
        name: e.g. `"rtx4090"`, `"RTX 4090"`, `"GeForce RTX 4060 Ti 16GB"`,
            `"cpu-avx512-bf16"`, `"local"` or `"my_gpu.json"`.

    Returns:
        The `HardwareProfile`.

    Raises:
        HardwareError: for an unknown name; the message lists the known names and
            the closest match.

    Example:

    ```python
    autoprec.hardware.get("rtx 2080 ti").is_fast("bfloat16")  # False
    ```
    """
    if not isinstance(name, str) or not name.strip():
        raise HardwareError(f"hardware name must be a non-empty string, got {name!r}.")
    if name.strip().lower() in ("local", "detect", "auto"):
        return detect()
    if name.lower().endswith(".json") and Path(name).exists():
        return load_profile(name)
    key = normalise_name(name)
    if key in NORMALISED:
        return BUILTIN[NORMALISED[key]]
    close = difflib.get_close_matches(key, list(NORMALISED), n=1, cutoff=0.5)
    hint = f" Did you mean {NORMALISED[close[0]]!r}?" if close else ""
    raise HardwareError(
        f"unknown hardware profile {name!r}.{hint} Known profiles: {', '.join(names())}; "
        "or pass 'local' to detect this device, or a path to a JSON profile file."
    )


def resolve_hardware(hardware: HardwareProfile | str | None) -> HardwareProfile:
    """Returns the `HardwareProfile` that a `hardware=` argument names: the one resolver.

    Args:
        hardware: `"local"` for this device (detected), a profile name
            such as `"rtx4090"` (any spelling `get` accepts), the path of a JSON
            profile file, or a `HardwareProfile`, returned as it is.

    Returns:
        The profile.

    Raises:
        HardwareError: for an unknown name or a value of another type.

    Example:

    ```python
    autoprec.hardware.resolve_hardware("rtx4090").name  # "rtx4090"
    ```
    """
    if hardware is None:
        return detect()
    if isinstance(hardware, HardwareProfile):
        return hardware
    if isinstance(hardware, str):
        return get(hardware)
    raise HardwareError(
        f"hardware= expects 'local', a profile name such as 'rtx4090', a JSON profile path "
        f"or a HardwareProfile; got {type(hardware).__name__}."
    )


def is_local(hardware: HardwareProfile | str | None) -> bool:
    """Returns whether a `hardware=` argument means this device: `"local"`, or a detected profile.

    A `HardwareProfile` that `autoprec.hardware.detect()` made (`detected=True`),
    edited or not, describes this device: costs are measured here for it.

    Args:
        hardware: a `hardware=` argument.

    Returns:
        True for `None`, `"local"` (`"detect"`, `"auto"`) and a detected profile.

    Example:

    ```python
    is_local("local"), is_local("rtx4090")  # (True, False)
    ```
    """
    if isinstance(hardware, HardwareProfile):
        return bool(hardware.detected)
    return hardware is None or (
        isinstance(hardware, str) and hardware.strip().lower() in ("local", "detect", "auto")
    )
