"""The one resolver of `hardware=`: profile names, JSON files, profile objects and `"local"`, this
device (CPU flags and memory, GPUs seen by TensorFlow, JAX or PyTorch), detected once per process."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
from pathlib import Path

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16
from ..errors import HardwareError
from .profile import (
    BUILTIN,
    CPU_MEMORY,
    GIB,
    GIGA,
    NORMALISED,
    HardwareProfile,
    cpu_profile,
    load_profile,
    normalise_name,
)

#: The first compute capability with FP8 tensor cores (Ada; Hopper 9.0, Blackwell 10.x/12.x).
FLOAT8_MIN_CAPABILITY = (8, 9)


def _cpu_flags(cpuinfo_path: str = "/proc/cpuinfo") -> tuple[set[str], str, float | None]:
    """Returns (flags, model name, MHz) of the first processor in /proc/cpuinfo."""
    flags: set[str] = set()
    model = "CPU"
    megahertz: float | None = None
    try:
        text = Path(cpuinfo_path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return flags, model, megahertz
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = set(value.split())
        elif key == "model name" and model == "CPU":
            model = value.strip()
        elif key == "cpu MHz" and megahertz is None:
            try:
                megahertz = float(value)
            except ValueError:
                pass
    return flags, model, megahertz


def _total_memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


#: Why a CPU under TensorFlow gets float16 as slow whatever its flags say.
_TF_CPU_FLOAT16_NOTE = (
    "float16 slow: TensorFlow's CPU kernels run most float16 ops (convolutions and their "
    "gradients, elementwise ops, reductions) on Eigen fallbacks with conversions; whole "
    "train steps measured up to 65x slower than float32 (25-65x on an avx512_fp16 Xeon); a "
    "lone matmul may be fast through oneDNN: calibrate(dtypes=[..., 'float16']) measures "
    "per layer"
)
#: Why bfloat16 "fast" on a CPU is a capability claim only.
_CPU_BFLOAT16_NOTE = (
    "bfloat16 fast = native oneDNN kernels exist (a capability, not a speed claim): measured "
    "TensorFlow matmuls ran 0.6x to 3.5x float32's speed depending on host and shape, so the "
    "bfloat16 rate is taken equal to float32's and calibrate()'s measured per-layer costs "
    "decide where bfloat16 pays"
)


def _active_backend() -> str:
    """Returns the active Keras backend name (`"tensorflow"` if Keras cannot say)."""
    try:
        import keras

        return str(keras.backend.backend())
    except Exception:
        return "tensorflow"


def _cpu_bfloat16_per_cycle(flags: set[str], float32_per_cycle: float) -> float | None:
    """Returns the bfloat16 FLOP/cycle/core claimed for a detected CPU, or `None`."""
    if "amx_bf16" in flags:
        return 1024
    if "avx512_bf16" in flags:
        return float32_per_cycle
    return None


def _cpu_float16_per_cycle(flags: set[str], float32_per_cycle: float, backend: str) -> float | None:
    """Returns the float16 FLOP/cycle/core of a detected CPU, or `None` (slow on `backend`)."""
    if backend == "tensorflow":
        return None
    if "amx_fp16" in flags:
        return 1024
    if "avx512_fp16" in flags:
        return 2 * float32_per_cycle
    return None


def _cpu_source(
    model: str,
    cores: int,
    hertz: float,
    flags: set[str],
    backend: str,
    base: str,
    float16_per_cycle: float | None,
) -> str:
    """Returns the `source` text of a detected CPU: what was read, what is estimated and why."""
    wanted = [
        flag for flag in ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16") if flag in flags
    ]
    parts = [
        f"read from device: {model}, {cores} cores, flags "
        f"{', '.join(wanted) or 'none of the 16-bit ones'}",
        f"estimated: peak rates from flags x {hertz / 1e9:.2f} GHz x cores, bandwidth "
        f"{cores * 10} GB/s assumed (class {base})",
    ]
    if base != "cpu-generic":
        parts.append(_CPU_BFLOAT16_NOTE)
    if backend == "tensorflow":
        parts.append(_TF_CPU_FLOAT16_NOTE)
    elif float16_per_cycle is not None:
        parts.append(f"float16 fast from CPU flags only, not measured on the {backend} backend")
    return "; ".join(parts)


def detect_cpu(cpuinfo_path: str = "/proc/cpuinfo", backend: str | None = None) -> HardwareProfile:
    """Returns a profile of the local CPU from its feature flags, with estimated rates.

    Flags say what the silicon can do, not what the framework's kernels do with
    it. Under TensorFlow, float16 is always in `slow_dtypes` (its CPU kernels
    run float16 on Eigen fallbacks: whole steps are many times slower than
    float32, AVX512-FP16 or not). bfloat16 is in `fast_dtypes` when the CPU has
    AVX512-BF16 or AMX-BF16, as a capability claim only: its rate is taken equal
    to float32's (AMX: the tile rate), and measured per-layer costs
    (`autoprec.calibrate`) decide where it pays. `source` says all of this.

    Args:
        cpuinfo_path: the cpuinfo file to read (for tests).
        backend: Keras backend the profile is for; default the active one.

    Returns:
        A `kind="cpu"` profile; `source` says which figures are estimated and why.

    Example:

    ```python
    hw = autoprec.hardware.detect_cpu()
    hw.support("float16")  # "slow" under the TensorFlow backend
    ```
    """
    backend = backend or _active_backend()
    flags, model, megahertz = _cpu_flags(cpuinfo_path)
    cores = os.cpu_count() or 1
    hertz = (megahertz or 2500.0) * 1e6
    float32_per_cycle = 64 if "avx512f" in flags else (32 if "avx2" in flags else 16)
    bfloat16_per_cycle = _cpu_bfloat16_per_cycle(flags, float32_per_cycle)
    float16_per_cycle = _cpu_float16_per_cycle(flags, float32_per_cycle, backend)
    if "amx_bf16" in flags:
        base = "cpu-amx"
    elif "avx512_bf16" in flags:
        base = "cpu-avx512-bf16"
    else:
        base = "cpu-generic"
    source = _cpu_source(model, cores, hertz, flags, backend, base, float16_per_cycle)
    return cpu_profile(
        "local-cpu",
        model,
        float32_per_cycle,
        bfloat16_per_cycle,
        float16_per_cycle,
        source,
        cores=cores,
        hertz=hertz,
        bandwidth=min(cores * 10 * GIGA, 200 * GIGA),
        memory=_total_memory_bytes() or CPU_MEMORY,
        detected=True,
    )


def cpu_flags() -> dict[str, bool]:
    """Returns the 16-bit-relevant flags of the local CPU as read from /proc/cpuinfo.

    Returns:
        `{"avx512_bf16": ..., "amx_bf16": ..., "avx512_fp16": ..., "amx_fp16": ...}`.
    """
    flags, _, _ = _cpu_flags()
    return {flag: flag in flags for flag in ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")}


def _gpu_from_tensorflow() -> tuple[str, str | None, int | None] | None:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    details = tf.config.experimental.get_device_details(gpus[0])
    capability = details.get("compute_capability")
    capability_text = f"{capability[0]}.{capability[1]}" if capability else None
    return details.get("device_name", "GPU"), capability_text, None


def _gpu_from_jax() -> tuple[str, str | None, int | None] | None:
    import jax

    devices = [device for device in jax.devices() if device.platform == "gpu"]
    if not devices:
        return None
    device = devices[0]
    try:
        memory = int((device.memory_stats() or {}).get("bytes_limit")) or None
    except Exception:  # noqa: BLE001 - the memory is optional
        memory = None
    return (
        getattr(device, "device_kind", "GPU"),
        getattr(device, "compute_capability", None),
        memory,
    )


def _gpu_from_torch() -> tuple[str, str | None, int | None] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    properties = torch.cuda.get_device_properties(0)
    return properties.name, f"{properties.major}.{properties.minor}", int(properties.total_memory)


def _local_gpu(backend: str) -> tuple[str, str | None, int | None] | None:
    """Returns (device name, compute capability, memory bytes or None) of the first GPU."""
    readers = (_gpu_from_tensorflow, _gpu_from_jax, _gpu_from_torch)
    order = {"jax": (1, 2, 0), "torch": (2, 1, 0)}.get(backend, (0, 1, 2))
    for index in order:
        try:
            found = readers[index]()
        except Exception:  # noqa: BLE001 - a framework not installed or not working here
            continue
        if found is not None:
            return found
    return None


def profile_for_gpu(
    device_name: str, compute_capability: str | None = None, memory_bytes: int | None = None
) -> HardwareProfile:
    """Maps a GPU's reported name to its built-in profile, or builds one from what is known.

    Args:
        device_name: the name the driver reports, e.g. `"NVIDIA GeForce RTX 4090"`.
        compute_capability: e.g. `"8.9"`, when known.
        memory_bytes: device memory when known (picks the 8/16 GB RTX 4060 Ti).

    Returns:
        The matching built-in profile marked `detected=True`, or for an unknown
        GPU a profile whose rates are marked `"estimated: ..."`; float8 is fast
        (`supports_float8`) on compute capability 8.9 and later.

    Example:

    ```python
    autoprec.hardware.profile_for_gpu("NVIDIA H200", "9.0").supports_float8  # True
    ```
    """
    key = normalise_name(device_name)
    exact = NORMALISED.get(key, "")
    # The two RTX 4060 Ti share one name: their memory tells them apart (below).
    if exact in BUILTIN and BUILTIN[exact].kind == "gpu" and not exact.startswith("rtx4060ti"):
        return _detected_builtin(exact, device_name)
    candidates = sorted(
        (name for name in BUILTIN if BUILTIN[name].kind == "gpu" and name.split("-")[0] in key),
        key=len,
        reverse=True,
    )
    if candidates:
        name = candidates[0]
        if name.startswith("rtx4060ti"):
            big = (memory_bytes or 0) > 12 * GIB or "16gb" in key
            name = "rtx4060ti-16gb" if big else "rtx4060ti-8gb"
        exact_boundary = re.search(re.escape(name.split("-")[0]) + r"(?![0-9a-z])", key)
        if exact_boundary or name.startswith("rtx4060ti"):
            return _detected_builtin(name, device_name)
    return _estimated_gpu(device_name, compute_capability, memory_bytes)


def _detected_builtin(name: str, device_name: str) -> HardwareProfile:
    """Returns built-in profile `name` marked as the detected `device_name`."""
    profile = BUILTIN[name]
    return dataclasses.replace(
        profile, detected=True, source=f"{profile.source}; device {device_name!r}"
    )


def _capability_tuple(compute_capability: str | None) -> tuple[int, int] | None:
    """Returns `(major, minor)` of a compute capability such as `"8.9"`, or `None`."""
    if not compute_capability:
        return None
    major, _, minor = str(compute_capability).partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        return None


def _estimated_gpu(
    device_name: str, compute_capability: str | None, memory_bytes: int | None
) -> HardwareProfile:
    capability = _capability_tuple(compute_capability)
    major = capability[0] if capability else 0
    reference = {7: "rtx2080ti", 8: "rtx3080", 9: "h100", 10: "rtx5080", 12: "rtx5080"}.get(
        major, "rtx3080"
    )
    if capability == (8, 9):
        reference = "rtx4080"
    base = BUILTIN[reference]
    fast = tuple(
        dtype
        for dtype, needed in ((FLOAT16, 7), (BFLOAT16, 8))
        if major >= needed or (major == 0 and dtype == FLOAT16)
    )
    slow = tuple(dtype for dtype in (FLOAT16, BFLOAT16) if dtype not in fast)
    float8 = capability is not None and capability >= FLOAT8_MIN_CAPABILITY
    float8 = float8 and base.float8_flops is not None
    return dataclasses.replace(
        base,
        name=normalise_name(device_name) or "unknown-gpu",
        display_name=device_name,
        compute_capability=compute_capability,
        memory_bytes=int(memory_bytes or base.memory_bytes),
        fast_dtypes=(*fast, FLOAT8) if float8 else fast,
        slow_dtypes=slow,
        bfloat16_flops=base.bfloat16_flops if BFLOAT16 in fast else None,
        float8_flops=base.float8_flops if float8 else None,
        float8_flops_source=(
            f"estimated: copied from {base.display_name} ({base.float8_flops_source})"
            if float8
            else None
        ),
        detected=True,
        source=(
            f"read from device: name {device_name!r}, compute capability "
            f"{compute_capability or 'unknown'}"
            + (", memory" if memory_bytes else "")
            + f"; estimated: rates and bandwidth copied from {base.display_name}, "
            "16-bit and float8 support from the compute capability (unknown GPU; float8 "
            "from 8.9 on)"
        ),
    )


def detect() -> HardwareProfile:
    """Returns the profile of the device this process computes on: its first GPU, else the CPU.

    GPUs are read through the active Keras backend's framework (TensorFlow,
    JAX or PyTorch; frameworks that are not installed are skipped) and mapped to
    the built-in table; unknown GPUs and CPUs get estimated rates, marked so in
    `source`. A GPU of compute capability 8.9 or later (Ada, Hopper, Blackwell)
    has float8 (`supports_float8`); its FP8 matrix products come from XLA (JAX,
    or TensorFlow under `jit_compile=True`). A CPU is described by `detect_cpu`
    (float16 slow under TensorFlow; never float8: Keras' float8 path runs there
    emulated, slower than bfloat16). The device is read once per process (and
    Keras backend); later calls return the same profile.

    Returns:
        A `HardwareProfile` with `detected=True`.

    Example:

    ```python
    hw = autoprec.hardware.detect()
    print(hw.summary())
    ```
    """
    return _detect(_active_backend())


@functools.cache
def _detect(backend: str) -> HardwareProfile:
    """The device of `detect()`, read once per process and backend (reading a GPU can take seconds)."""
    gpu = _local_gpu(backend)
    if gpu is not None:
        device_name, capability, memory = gpu
        return profile_for_gpu(device_name, capability, memory)
    return detect_cpu(backend=backend)


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
