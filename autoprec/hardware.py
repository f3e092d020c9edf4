"""Hardware profiles: what a device computes fast, how fast, and how much memory it has.

A `HardwareProfile` is a plain, frozen value. Built-in profiles cover consumer
NVIDIA RTX cards (figures from NVIDIA's whitepapers, see `shared/design.md`) and
three nominal CPU classes; `detect()` reads the local device; `load_profile()`
reads a user JSON file. A CPU's flags say what the silicon can do, not what the
framework's kernels make of it: under TensorFlow a CPU never gets float16 as
fast, and bfloat16 "fast" is a capability that measured per-layer costs confirm
or refute layer by layer. Every profile says where its figures come from in
`source`: `"built-in table"`, `"read from device"`, `"user file: ..."` or
`"estimated: ..."`, so a guess is never presented as a fact.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from pathlib import Path
from typing import Any

from ._core.dtypes import BFLOAT16, COMPUTE_DTYPES, FLOAT16, FLOAT32
from ._core.io import atomic_write_json, read_json_file
from .errors import HardwareError

_TERA = 1e12
_GIGA = 1e9
_GIB = 1024**3

#: Support levels a dtype can have on a device.
FAST = "fast"
SLOW = "slow"
UNSUPPORTED = "unsupported"


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    """Peak rates, memory and 16-bit support of one device.

    Args:
        name: short profile name, e.g. `"rtx4090"`.
        display_name: human-readable device name, e.g. `"NVIDIA GeForce RTX 4090"`.
        kind: `"gpu"` or `"cpu"`.
        compute_capability: CUDA compute capability such as `"8.9"`, or `None`.
        float32_flops: dense float32 peak, FLOP/s.
        float16_flops: float16 peak (tensor cores, float32 accumulate) in FLOP/s,
            or `None` when the device has no fast float16 path.
        bfloat16_flops: bfloat16 peak in FLOP/s, or `None` when it has no fast path.
        memory_bandwidth: memory bandwidth, bytes/s.
        memory_bytes: device memory, bytes.
        fast_dtypes: 16-bit dtypes with native fast kernels (float32 is always fast).
        slow_dtypes: 16-bit dtypes that run, but emulated or on fallback kernels.
        alignment: 16-bit matmul/conv dimensions should be multiples of this many
            elements to reach the 16-bit rate (1: no rule).
        op_overhead_seconds: fixed cost of launching one kernel/op.
        slow_penalty: time multiplier for a dtype in `slow_dtypes`.
        source: where the figures come from (`"built-in table"`, `"read from
            device"`, `"user file: ..."`, `"estimated: ..."`).
        detected: whether this profile describes the device this process runs on.

    Example:

    ```python
    hw = autoprec.hardware.get("RTX 4090")
    hw.peak_flops("bfloat16") / hw.peak_flops("float32")  # 2.0
    ```
    """

    name: str
    display_name: str
    kind: str
    compute_capability: str | None
    float32_flops: float
    float16_flops: float | None
    bfloat16_flops: float | None
    memory_bandwidth: float
    memory_bytes: int
    fast_dtypes: tuple[str, ...] = (FLOAT32,)
    slow_dtypes: tuple[str, ...] = ()
    alignment: int = 8
    op_overhead_seconds: float = 5e-6
    slow_penalty: float = 8.0
    source: str = "built-in table"
    detected: bool = False

    def support(self, dtype: str) -> str:
        """Returns `"fast"`, `"slow"` or `"unsupported"` for a compute dtype.

        Args:
            dtype: `"float32"`, `"bfloat16"` or `"float16"`.

        Returns:
            The support level of `dtype` on this device.
        """
        if dtype == FLOAT32 or dtype in self.fast_dtypes:
            return FAST
        if dtype in self.slow_dtypes:
            return SLOW
        return UNSUPPORTED

    def is_fast(self, dtype: str) -> bool:
        """Returns whether `dtype` runs on native fast kernels on this device."""
        return self.support(dtype) == FAST

    def peak_flops(self, dtype: str) -> float:
        """Returns the matmul/conv peak rate of `dtype` in FLOP/s.

        A dtype without a fast path runs at the float32 rate here; the slowness
        of emulation is applied separately through `slow_penalty`.

        Args:
            dtype: a compute dtype.

        Returns:
            Peak FLOP/s.
        """
        rate = {FLOAT16: self.float16_flops, BFLOAT16: self.bfloat16_flops}.get(dtype)
        if rate is None or not self.is_fast(dtype):
            return self.float32_flops
        return rate

    def to_dict(self) -> dict[str, Any]:
        """Returns the profile as a JSON-serialisable dict (the user-file format)."""
        data = dataclasses.asdict(self)
        data["fast_dtypes"] = list(self.fast_dtypes)
        data["slow_dtypes"] = list(self.slow_dtypes)
        return data

    def save(self, path: str | os.PathLike) -> Path:
        """Writes the profile to a JSON file that `load_profile` reads back.

        Args:
            path: destination file.

        Returns:
            The written path.
        """
        data = self.to_dict()
        data.pop("detected")
        return atomic_write_json(path, data)

    def summary(self) -> str:
        """Returns a few lines describing the profile."""

        def tflops(rate: float | None) -> str:
            return "-" if rate is None else f"{rate / _TERA:.1f}"

        support = ", ".join(f"{dtype} {self.support(dtype)}" for dtype in COMPUTE_DTYPES)
        return "\n".join(
            [
                f"{self.display_name} ({self.name}, {self.kind}"
                + (f", CC {self.compute_capability}" if self.compute_capability else "")
                + ")",
                f"  TFLOP/s: float32 {tflops(self.float32_flops)}, float16 "
                f"{tflops(self.float16_flops)}, bfloat16 {tflops(self.bfloat16_flops)}",
                f"  memory {self.memory_bytes / _GIB:.1f} GiB at "
                f"{self.memory_bandwidth / _GIGA:.0f} GB/s; alignment {self.alignment}",
                f"  dtypes: {support}",
                f"  source: {self.source}",
            ]
        )


# --------------------------------------------------------------------------- built-ins

# name, display name, CC, VRAM GB, GB/s, FP32, FP16 TC, BF16 TC (TFLOPS; None: no bf16 TC)
_RTX_TABLE: tuple[tuple[str, str, str, float, float, float, float, float | None], ...] = (
    ("rtx2060", "NVIDIA GeForce RTX 2060", "7.5", 6, 336, 6.5, 25.8, None),
    ("rtx2080ti", "NVIDIA GeForce RTX 2080 Ti", "7.5", 11, 616, 13.4, 53.8, None),
    ("rtx3060", "NVIDIA GeForce RTX 3060", "8.6", 12, 360, 12.7, 25.5, 25.5),
    ("rtx3080", "NVIDIA GeForce RTX 3080", "8.6", 10, 760, 29.8, 59.5, 59.5),
    ("rtx3090", "NVIDIA GeForce RTX 3090", "8.6", 24, 936, 35.6, 71.0, 71.0),
    ("rtx4060ti-8gb", "NVIDIA GeForce RTX 4060 Ti 8GB", "8.9", 8, 288, 22.1, 44.1, 44.1),
    ("rtx4060ti-16gb", "NVIDIA GeForce RTX 4060 Ti 16GB", "8.9", 16, 288, 22.1, 44.1, 44.1),
    ("rtx4070", "NVIDIA GeForce RTX 4070", "8.9", 12, 504, 29.1, 58.3, 58.3),
    ("rtx4080", "NVIDIA GeForce RTX 4080", "8.9", 16, 716.8, 48.7, 97.5, 97.5),
    ("rtx4090", "NVIDIA GeForce RTX 4090", "8.9", 24, 1008, 82.6, 165.2, 165.2),
    ("rtx5070", "NVIDIA GeForce RTX 5070", "12.0", 12, 672, 30.9, 61.7, 61.7),
    ("rtx5080", "NVIDIA GeForce RTX 5080", "12.0", 16, 960, 56.3, 112.6, 112.6),
    ("rtx5090", "NVIDIA GeForce RTX 5090", "12.0", 32, 1792, 104.8, 209.5, 209.5),
)

#: Extra spellings that map to a built-in profile (normalised form).
_ALIASES = {"rtx4060ti": "rtx4060ti-8gb"}

# Nominal CPU: 8 cores at 3 GHz, 2 FMA units. float32 FLOP/cycle/core: AVX-512 64,
# AVX2 32; AVX512-BF16 dot products double it; AMX tiles give ~16x for bf16.
_CPU_CORES = 8
_CPU_HZ = 3.0e9
_CPU_BANDWIDTH = 50 * _GIGA
_CPU_MEMORY = 32 * _GIB
_CPU_OP_OVERHEAD = 30e-6


def _gpu_profile(row: tuple) -> HardwareProfile:
    name, display, capability, vram_gb, bandwidth_gbs, fp32, fp16, bf16 = row
    fast = (FLOAT16, BFLOAT16) if bf16 is not None else (FLOAT16,)
    slow = () if bf16 is not None else (BFLOAT16,)
    return HardwareProfile(
        name=name,
        display_name=display,
        kind="gpu",
        compute_capability=capability,
        float32_flops=fp32 * _TERA,
        float16_flops=fp16 * _TERA,
        bfloat16_flops=None if bf16 is None else bf16 * _TERA,
        memory_bandwidth=bandwidth_gbs * _GIGA,
        memory_bytes=int(vram_gb * _GIB),
        fast_dtypes=fast,
        slow_dtypes=slow,
        alignment=8,
        op_overhead_seconds=5e-6,
        slow_penalty=8.0,
        source="built-in table",
    )


def _cpu_profile(
    name: str,
    display: str,
    float32_per_cycle: float,
    bfloat16_per_cycle: float | None,
    float16_per_cycle: float | None,
    source: str,
    cores: int = _CPU_CORES,
    hertz: float = _CPU_HZ,
    bandwidth: float = _CPU_BANDWIDTH,
    memory: int = _CPU_MEMORY,
    detected: bool = False,
) -> HardwareProfile:
    def rate(per_cycle: float | None) -> float | None:
        return None if per_cycle is None else per_cycle * cores * hertz

    fast = tuple(
        dtype
        for dtype, per_cycle in ((FLOAT16, float16_per_cycle), (BFLOAT16, bfloat16_per_cycle))
        if per_cycle is not None
    )
    slow = tuple(dtype for dtype in (FLOAT16, BFLOAT16) if dtype not in fast)
    return HardwareProfile(
        name=name,
        display_name=display,
        kind="cpu",
        compute_capability=None,
        float32_flops=rate(float32_per_cycle),
        float16_flops=rate(float16_per_cycle),
        bfloat16_flops=rate(bfloat16_per_cycle),
        memory_bandwidth=bandwidth,
        memory_bytes=int(memory),
        fast_dtypes=fast,
        slow_dtypes=slow,
        alignment=1,
        op_overhead_seconds=_CPU_OP_OVERHEAD,
        slow_penalty=6.0,
        source=source,
        detected=detected,
    )


_NOMINAL = (
    "built-in table (nominal 8-core 3 GHz CPU, 50 GB/s, 32 GiB; float16 slow: TensorFlow's "
    "CPU kernels run it on Eigen fallbacks)"
)


def _builtin_profiles() -> dict[str, HardwareProfile]:
    profiles = {row[0]: _gpu_profile(row) for row in _RTX_TABLE}
    profiles["cpu-amx"] = _cpu_profile("cpu-amx", "CPU with AMX-BF16", 64, 1024, None, _NOMINAL)
    profiles["cpu-avx512-bf16"] = _cpu_profile(
        "cpu-avx512-bf16", "CPU with AVX512-BF16", 64, 128, None, _NOMINAL
    )
    profiles["cpu-generic"] = _cpu_profile(
        "cpu-generic", "CPU (AVX2, no native 16-bit)", 32, None, None, _NOMINAL
    )
    return profiles


_BUILTIN: dict[str, HardwareProfile] = _builtin_profiles()


def _normalise(name: str) -> str:
    text = name.lower().replace("nvidia", "").replace("geforce", "")
    return re.sub(r"[\s_\-]+", "", text)


_NORMALISED = {_normalise(name): name for name in _BUILTIN}
_NORMALISED.update({_normalise(alias): target for alias, target in _ALIASES.items()})


def names() -> list[str]:
    """Returns the names of the built-in hardware profiles.

    Returns:
        Names accepted by `get`, GPUs first, e.g. `["rtx2060", ..., "cpu-generic"]`.

    Example:

    ```python
    "rtx4090" in autoprec.hardware.names()  # True
    ```
    """
    return list(_BUILTIN)


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
    key = _normalise(name)
    if key in _NORMALISED:
        return _BUILTIN[_NORMALISED[key]]
    close = difflib.get_close_matches(key, list(_NORMALISED), n=1, cutoff=0.5)
    hint = f" Did you mean {_NORMALISED[close[0]]!r}?" if close else ""
    raise HardwareError(
        f"unknown hardware profile {name!r}.{hint} Known profiles: {', '.join(names())}; "
        "or pass 'local' to detect this device, or a path to a JSON profile file."
    )


def resolve_hardware(hardware: HardwareProfile | str | None) -> HardwareProfile:
    """Returns the `HardwareProfile` that a `hardware=` argument names: the one resolver.

    Args:
        hardware: `None` or `"local"` for this device (detected), a profile name
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
    """Returns whether a `hardware=` argument means this device (`None` or `"local"`)."""
    return hardware is None or (
        isinstance(hardware, str) and hardware.strip().lower() in ("local", "detect", "auto")
    )


# --------------------------------------------------------------------------- user files

_REQUIRED_FIELDS = ("name", "kind", "float32_flops", "memory_bandwidth", "memory_bytes")
_FIELD_TYPES = {field.name: field for field in dataclasses.fields(HardwareProfile)}


def _check_positive(path: str, field: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise HardwareError(f"{path}: field {field!r} must be a positive number, got {value!r}.")


def _check_dtype_list(path: str, field: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or any(item not in COMPUTE_DTYPES for item in value):
        raise HardwareError(
            f"{path}: field {field!r} must be a list of dtypes from "
            f"{', '.join(COMPUTE_DTYPES)}, got {value!r}."
        )
    return tuple(value)


def profile_from_dict(data: Any, source: str = "user data") -> HardwareProfile:
    """Builds a `HardwareProfile` from a dict in the `to_dict` format, validating it.

    Args:
        data: the decoded JSON object.
        source: where the data comes from, used in error messages and recorded
            in the profile's `source` unless the data names one.

    Returns:
        The validated profile.

    Raises:
        HardwareError: naming `source` and the offending field.
    """
    if not isinstance(data, dict):
        raise HardwareError(f"{source}: a hardware profile must be a JSON object.")
    unknown = sorted(set(data) - set(_FIELD_TYPES))
    if unknown:
        raise HardwareError(
            f"{source}: unknown field(s) {', '.join(map(repr, unknown))}; "
            f"allowed fields: {', '.join(_FIELD_TYPES)}."
        )
    missing = [field for field in _REQUIRED_FIELDS if field not in data]
    if missing:
        raise HardwareError(f"{source}: missing required field(s) {', '.join(missing)}.")
    if not isinstance(data["name"], str) or not data["name"].strip():
        raise HardwareError(f"{source}: field 'name' must be a non-empty string.")
    if data["kind"] not in ("gpu", "cpu"):
        raise HardwareError(f"{source}: field 'kind' must be 'gpu' or 'cpu', got {data['kind']!r}.")
    for field in ("float32_flops", "memory_bandwidth", "memory_bytes"):
        _check_positive(source, field, data[field])
    for field in ("float16_flops", "bfloat16_flops"):
        _check_positive(source, field, data.get(field), allow_none=True)
    for field in ("op_overhead_seconds", "slow_penalty", "alignment"):
        if field in data:
            _check_positive(source, field, data[field])
    values = dict(data)
    values.setdefault("display_name", data["name"])
    values.setdefault("compute_capability", None)
    values.setdefault("float16_flops", None)
    values.setdefault("bfloat16_flops", None)
    if "fast_dtypes" not in values:
        values["fast_dtypes"] = [
            dtype
            for dtype, field in ((FLOAT16, "float16_flops"), (BFLOAT16, "bfloat16_flops"))
            if values[field] is not None
        ]
    values["fast_dtypes"] = _check_dtype_list(source, "fast_dtypes", values["fast_dtypes"])
    values["slow_dtypes"] = _check_dtype_list(source, "slow_dtypes", values.get("slow_dtypes", []))
    for dtype in values["fast_dtypes"]:
        if dtype != FLOAT32 and values[f"{dtype}_flops"] is None:
            raise HardwareError(
                f"{source}: {dtype} is listed in 'fast_dtypes' but '{dtype}_flops' is missing."
            )
    values["memory_bytes"] = int(values["memory_bytes"])
    values["alignment"] = int(values.get("alignment", 8))
    values["source"] = values.get("source") or source
    values["detected"] = False
    return HardwareProfile(**values)


def load_profile(path: str | os.PathLike) -> HardwareProfile:
    """Reads a hardware profile from a JSON file.

    Fields are those of `HardwareProfile` in SI units (FLOP/s, bytes/s, bytes);
    `name`, `kind`, `float32_flops`, `memory_bandwidth` and `memory_bytes` are required.

    Args:
        path: the JSON file.

    Returns:
        The profile, with `source` `"user file: <path>"` unless the file names one.

    Raises:
        HardwareError: naming the file and the field when the file is unreadable,
            not JSON, or a field is missing or invalid.

    Example:

    ```python
    autoprec.hardware.get("rtx4090").save("/tmp/my_gpu.json")
    autoprec.hardware.load_profile("/tmp/my_gpu.json").name  # "rtx4090"
    ```
    """
    data = read_json_file(path, HardwareError, "hardware profile")
    source = f"user file: {path}"
    if isinstance(data, dict) and "source" in data:
        data = {**data, "source": f"{source} ({data['source']})"}
    return profile_from_dict(data, source=source)


# --------------------------------------------------------------------------- detection


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
    """Returns the bfloat16 FLOP/cycle/core claimed for a detected CPU, or `None`.

    AMX tiles are a large, real gain; AVX512-BF16 dot products double the peak on
    paper only (see `_CPU_BFLOAT16_NOTE`), so they get float32's rate.
    """
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
    return _cpu_profile(
        "local-cpu",
        model,
        float32_per_cycle,
        bfloat16_per_cycle,
        float16_per_cycle,
        source,
        cores=cores,
        hertz=hertz,
        bandwidth=min(cores * 10 * _GIGA, 200 * _GIGA),
        memory=_total_memory_bytes() or _CPU_MEMORY,
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
    try:
        import tensorflow as tf
    except Exception:
        return None
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    details = tf.config.experimental.get_device_details(gpus[0])
    capability = details.get("compute_capability")
    capability_text = f"{capability[0]}.{capability[1]}" if capability else None
    return details.get("device_name", "GPU"), capability_text, None


def _gpu_from_jax() -> tuple[str, str | None, int | None] | None:
    try:
        import jax
    except Exception:
        return None
    try:
        devices = [device for device in jax.devices() if device.platform == "gpu"]
    except Exception:
        return None
    if not devices:
        return None
    device = devices[0]
    capability = getattr(device, "compute_capability", None)
    memory = None
    try:
        memory = int((device.memory_stats() or {}).get("bytes_limit")) or None
    except Exception:
        memory = None
    return getattr(device, "device_kind", "GPU"), capability, memory


def _gpu_from_torch() -> tuple[str, str | None, int | None] | None:
    try:
        import torch
    except Exception:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        properties = torch.cuda.get_device_properties(0)
    except Exception:
        return None
    capability = f"{properties.major}.{properties.minor}"
    return properties.name, capability, int(properties.total_memory)


def _local_gpu() -> tuple[str, str | None, int | None] | None:
    """Returns (device name, compute capability, memory bytes or None) of the first GPU."""
    backend = _active_backend()
    readers = {
        "tensorflow": (_gpu_from_tensorflow, _gpu_from_jax, _gpu_from_torch),
        "jax": (_gpu_from_jax, _gpu_from_torch, _gpu_from_tensorflow),
        "torch": (_gpu_from_torch, _gpu_from_jax, _gpu_from_tensorflow),
    }.get(backend, (_gpu_from_tensorflow, _gpu_from_jax, _gpu_from_torch))
    for reader in readers:
        found = reader()
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
        GPU a profile whose rates are marked `"estimated: ..."`.
    """
    key = _normalise(device_name)
    candidates = sorted(
        (name for name in _BUILTIN if _BUILTIN[name].kind == "gpu" and name.split("-")[0] in key),
        key=len,
        reverse=True,
    )
    if candidates:
        name = candidates[0]
        if name.startswith("rtx4060ti"):
            big = (memory_bytes or 0) > 12 * _GIB or "16gb" in key
            name = "rtx4060ti-16gb" if big else "rtx4060ti-8gb"
        exact_boundary = re.search(re.escape(name.split("-")[0]) + r"(?![0-9a-z])", key)
        if exact_boundary or name.startswith("rtx4060ti"):
            return dataclasses.replace(
                _BUILTIN[name], detected=True, source=f"built-in table; device {device_name!r}"
            )
    return _estimated_gpu(device_name, compute_capability, memory_bytes)


def _estimated_gpu(
    device_name: str, compute_capability: str | None, memory_bytes: int | None
) -> HardwareProfile:
    major = 0
    if compute_capability:
        try:
            major = int(str(compute_capability).split(".")[0])
        except ValueError:
            major = 0
    reference = {7: "rtx2080ti", 8: "rtx3080", 9: "rtx4090", 10: "rtx5080", 12: "rtx5080"}.get(
        major, "rtx3080"
    )
    if compute_capability and compute_capability.startswith("8.9"):
        reference = "rtx4080"
    base = _BUILTIN[reference]
    fast = tuple(
        dtype
        for dtype, needed in ((FLOAT16, 7), (BFLOAT16, 8))
        if major >= needed or (major == 0 and dtype == FLOAT16)
    )
    slow = tuple(dtype for dtype in (FLOAT16, BFLOAT16) if dtype not in fast)
    return dataclasses.replace(
        base,
        name=_normalise(device_name) or "unknown-gpu",
        display_name=device_name,
        compute_capability=compute_capability,
        memory_bytes=int(memory_bytes or base.memory_bytes),
        fast_dtypes=fast,
        slow_dtypes=slow,
        bfloat16_flops=base.bfloat16_flops if BFLOAT16 in fast else None,
        detected=True,
        source=(
            f"read from device: name {device_name!r}, compute capability "
            f"{compute_capability or 'unknown'}"
            + (", memory" if memory_bytes else "")
            + f"; estimated: rates and bandwidth copied from {base.display_name}, "
            "16-bit support from the compute capability (unknown GPU)"
        ),
    )


def detect() -> HardwareProfile:
    """Returns the profile of the device this process computes on: its first GPU, else the CPU.

    GPUs are read through the active Keras backend's framework (TensorFlow,
    JAX or PyTorch; frameworks that are not installed are skipped) and mapped to
    the built-in table; unknown GPUs and CPUs get estimated rates, marked so in
    `source`. A CPU is described by `detect_cpu` (float16 slow under TensorFlow).

    Returns:
        A `HardwareProfile` with `detected=True`.

    Example:

    ```python
    hw = autoprec.hardware.detect()
    print(hw.summary())
    ```
    """
    gpu = _local_gpu()
    if gpu is not None:
        device_name, capability, memory = gpu
        return profile_for_gpu(device_name, capability, memory)
    return detect_cpu()
