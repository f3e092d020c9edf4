"""Hardware profiles: what a device computes fast, how fast and how much memory it has; the
built-in profiles (whitepaper figures), user profile files, and the one resolver of `hardware=`
(`"local"`: this device, detected once per process)."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._core.dtypes import BFLOAT16, COMPUTE_DTYPES, FLOAT8, FLOAT16, FLOAT32, PLAN_DTYPES
from .._core.io import atomic_write_json, read_json_file
from ..errors import HardwareError

__all__ = [
    "HardwareProfile",
    "cpu_flags",
    "detect",
    "detect_cpu",
    "get",
    "is_local",
    "load_profile",
    "names",
    "profile_for_gpu",
    "profile_from_dict",
    "resolve_hardware",
]

TERA = 1e12
GIGA = 1e9
GIB = 1024**3

#: Support levels a dtype can have on a device.
FAST = "fast"
SLOW = "slow"
UNSUPPORTED = "unsupported"

#: FP8 matrix products want every matmul dimension a multiple of this many elements
#: (cuBLASLt FP8 GEMMs; `HardwareProfile.float8_alignment`).
FLOAT8_ALIGNMENT = 16


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    """Peak rates, memory and 16-bit and 8-bit support of one device."""

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
    float8_flops: float | None = None
    float8_flops_source: str | None = None
    float8_alignment: int = FLOAT8_ALIGNMENT

    def support(self, dtype: str) -> str:
        """Returns `"fast"`, `"slow"` or `"unsupported"` for a plan dtype."""
        if dtype == FLOAT32 or dtype in self.fast_dtypes:
            return FAST
        return SLOW if dtype in self.slow_dtypes else UNSUPPORTED

    def is_fast(self, dtype: str) -> bool:
        """Returns whether `dtype` runs on native fast kernels on this device."""
        return self.support(dtype) == FAST

    @property
    def supports_float8(self) -> bool:
        """Whether the device has FP8 tensor cores: `support("float8") == "fast"`."""
        return self.is_fast(FLOAT8)

    @property
    def search_dtypes(self) -> tuple[str, ...]:
        """The dtypes a search may use here: float32 and every fast dtype, widest first."""
        return tuple(dtype for dtype in PLAN_DTYPES if self.is_fast(dtype))

    def peak_flops(self, dtype: str) -> float:
        """Returns the matmul/conv peak rate of `dtype` in FLOP/s."""
        rate = getattr(self, f"{dtype}_flops", None)
        return self.float32_flops if rate is None or not self.is_fast(dtype) else rate

    def to_dict(self) -> dict[str, Any]:
        """Returns the profile as a JSON-serialisable dict (the user-file format)."""
        dtypes = {"fast_dtypes": list(self.fast_dtypes), "slow_dtypes": list(self.slow_dtypes)}
        return {**dataclasses.asdict(self), **dtypes}

    def save(self, path: str | os.PathLike) -> Path:
        """Writes the profile to a JSON file that `load_profile` reads back."""
        return atomic_write_json(path, {k: v for k, v in self.to_dict().items() if k != "detected"})

    def summary(self) -> str:
        """Returns a few lines describing the profile."""
        tflops = ", ".join(
            f"{dtype} {'-' if rate is None else f'{rate / TERA:.1f}'}"
            for dtype in (FLOAT32, FLOAT16, BFLOAT16, FLOAT8)
            if (rate := getattr(self, f"{dtype}_flops")) is not None or dtype != FLOAT8
        )
        capability = f", CC {self.compute_capability}" if self.compute_capability else ""
        lines = [
            f"{self.display_name} ({self.name}, {self.kind}{capability})",
            f"  TFLOP/s: {tflops}",
            f"  memory {self.memory_bytes / GIB:.1f} GiB at "
            f"{self.memory_bandwidth / GIGA:.0f} GB/s; alignment {self.alignment}",
            "  dtypes: " + ", ".join(f"{dtype} {self.support(dtype)}" for dtype in PLAN_DTYPES),
            f"  source: {self.source}",
        ]
        if self.float8_flops is not None:
            lines.append(f"  float8 rate: {self.float8_flops_source}")
        return "\n".join(lines)


_REQUIRED_FIELDS = ("name", "kind", "float32_flops", "memory_bandwidth", "memory_bytes")
#: The fields that must be positive numbers where given (and the rates, where not `None`).
_POSITIVE_FIELDS = (
    *_REQUIRED_FIELDS[2:], "op_overhead_seconds", "slow_penalty", "alignment", "float8_alignment"
)  # fmt: skip
_FIELD_TYPES = {field.name: field for field in dataclasses.fields(HardwareProfile)}


def _check_positive(path: str, field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise HardwareError(f"{path}: field {field!r} must be a positive number, got {value!r}.")


def _check_dtype_list(
    path: str, field: str, value: Any, allowed: tuple[str, ...] = COMPUTE_DTYPES
) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or any(item not in allowed for item in value):
        raise HardwareError(
            f"{path}: field {field!r} must be a list of dtypes from "
            f"{', '.join(allowed)}, got {value!r}."
        )
    return tuple(value)


#: The rate field each fast dtype needs.
_RATE_FIELDS = ((FLOAT16, "float16_flops"), (BFLOAT16, "bfloat16_flops"), (FLOAT8, "float8_flops"))


def profile_from_dict(data: Any, source: str = "user data") -> HardwareProfile:
    """Builds a `HardwareProfile` from a dict in the `to_dict` format, validating it."""
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
    rates = [field for _, field in _RATE_FIELDS]
    for field in (*_POSITIVE_FIELDS, *rates):
        if field in data and not (field in rates and data[field] is None):
            _check_positive(source, field, data[field])
    values = {"display_name": data["name"], **dict.fromkeys(("compute_capability", *rates)), **data}
    rated = [dtype for dtype, field in _RATE_FIELDS if values[field] is not None]
    values["fast_dtypes"] = _check_dtype_list(
        source, "fast_dtypes", values.get("fast_dtypes", rated), PLAN_DTYPES
    )
    if values["float8_flops"] is not None and FLOAT8 not in values["fast_dtypes"]:
        values["fast_dtypes"] = (*values["fast_dtypes"], FLOAT8)
    values["slow_dtypes"] = _check_dtype_list(source, "slow_dtypes", values.get("slow_dtypes", []))
    for dtype in values["fast_dtypes"]:
        if dtype != FLOAT32 and values[f"{dtype}_flops"] is None:
            raise HardwareError(
                f"{source}: {dtype} is listed in 'fast_dtypes' but '{dtype}_flops' is missing."
            )
    values["memory_bytes"] = int(values["memory_bytes"])
    values["alignment"] = int(values.get("alignment", 8))
    values["float8_alignment"] = int(values.get("float8_alignment", FLOAT8_ALIGNMENT))
    if not isinstance(values.get("float8_flops_source") or "", str):
        raise HardwareError(f"{source}: field 'float8_flops_source' must be a string.")
    if values["float8_flops"] is not None and not values.get("float8_flops_source"):
        values["float8_flops_source"] = values.get("source") or source
    values["source"] = values.get("source") or source
    values["detected"] = False
    return HardwareProfile(**values)


def load_profile(path: str | os.PathLike) -> HardwareProfile:
    """Reads a hardware profile from a JSON file."""
    data = read_json_file(path, HardwareError, "hardware profile")
    source = f"user file: {path}"
    if isinstance(data, dict) and "source" in data:
        data = {**data, "source": f"{source} ({data['source']})"}
    return profile_from_dict(data, source=source)


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
    ("h100", "NVIDIA H100 SXM5 80GB", "9.0", 80, 3350, 66.9, 989.4, 989.4),
    ("h200", "NVIDIA H200 SXM 141GB", "9.0", 141, 4800, 66.9, 989.4, 989.4),
)

#: SXM Hoppers (CC 9.0, float16 with float32 accumulate at full rate), rows of `_RTX_TABLE` too:
#: name: (source, float8 rate source; None: the H100's)
_HOPPER_SOURCES = {
    "h100": (
        "built-in table (NVIDIA H100 Tensor Core GPU Architecture whitepaper, H100 SXM5: "
        "66.9 FP32, 989.4 dense FP16/BF16, 1978.9 dense FP8 TFLOPS, 80 GB HBM3 at 3.35 TB/s)",
        None,
    ),
    "h200": (
        "built-in table (NVIDIA H200 Tensor Core GPU datasheet: 141 GB HBM3e at 4.8 TB/s; "
        "compute of the H100 SXM5 in the NVIDIA H100 Tensor Core GPU Architecture whitepaper)",
        "NVIDIA H200 Tensor Core GPU datasheet: FP8 Tensor 3958 TFLOPS with sparsity, 1978.9 "
        "dense, the H100 SXM5's (NVIDIA H100 Tensor Core GPU Architecture whitepaper)",
    ),
}

#: Where the FP8 rate of each GPU architecture with FP8 tensor cores comes from, by compute
#: capability (Ada and Blackwell: 2x the BF16 TC column); Turing and Ampere have none.
FLOAT8_RATE_SOURCES: dict[str, str] = {
    "8.9": (
        "NVIDIA Ada GPU Architecture whitepaper: dense FP8 Tensor TFLOPS with FP32 "
        "accumulate = 2x FP16/BF16 Tensor with FP32 accumulate"
    ),
    "12.0": (
        "NVIDIA RTX Blackwell GPU Architecture whitepaper: dense FP8 Tensor TFLOPS with "
        "FP32 accumulate = 2x FP16/BF16 Tensor with FP32 accumulate"
    ),
    "9.0": (
        "NVIDIA H100 Tensor Core GPU Architecture whitepaper: H100 SXM5 dense FP8 Tensor "
        "TFLOPS with FP32 accumulate 1978.9"
    ),
}

#: Extra spellings that map to a built-in profile (normalised form).
_ALIASES = {
    "rtx4060ti": "rtx4060ti-8gb",
    "h100 sxm": "h100",
    "h100 sxm5": "h100",
    # The name the driver reports for an H100 SXM5.
    "h100 80gb hbm3": "h100",
    "h200 sxm": "h200",
    "h200 141gb": "h200",
}

CPU_MEMORY = 32 * GIB
_CPU_OP_OVERHEAD = 30e-6


def _rated_profile(
    rates: dict[str, float | None], flops: Callable[[float], float], **fields: Any
) -> HardwareProfile:
    """A profile fast in each dtype of `rates` with a rate (`flops(rate)` FLOP/s), others slow."""
    fast = tuple(dtype for dtype, rate in rates.items() if rate is not None and dtype != FLOAT32)
    rated = {
        f"{dtype}_flops": None if rate is None else flops(rate) for dtype, rate in rates.items()
    }
    slow = tuple(dtype for dtype in (FLOAT16, BFLOAT16) if dtype not in fast)
    return HardwareProfile(fast_dtypes=fast, slow_dtypes=slow, **rated, **fields)


def _gpu_profile(row: tuple) -> HardwareProfile:
    name, display, capability, vram_gb, bandwidth_gbs, fp32, fp16, bf16 = row
    float8_source = FLOAT8_RATE_SOURCES.get(capability)
    float8 = None if float8_source is None or bf16 is None else 2 * bf16
    return _rated_profile(
        {FLOAT32: fp32, FLOAT16: fp16, BFLOAT16: bf16, FLOAT8: float8},
        lambda rate: rate * TERA,
        name=name,
        display_name=display,
        kind="gpu",
        compute_capability=capability,
        memory_bandwidth=bandwidth_gbs * GIGA,
        memory_bytes=int(vram_gb * GIB),
        float8_flops_source=float8_source,
    )


def cpu_profile(
    name: str,
    display: str,
    float32_per_cycle: float,
    bfloat16_per_cycle: float | None,
    float16_per_cycle: float | None,
    source: str,
    cores: int = 8,
    hertz: float = 3.0e9,
    bandwidth: float = 50 * GIGA,
    memory: int = CPU_MEMORY,
    detected: bool = False,
) -> HardwareProfile:
    return _rated_profile(
        {FLOAT32: float32_per_cycle, FLOAT16: float16_per_cycle, BFLOAT16: bfloat16_per_cycle},
        lambda per_cycle: per_cycle * cores * hertz,
        name=name,
        display_name=display,
        kind="cpu",
        compute_capability=None,
        memory_bandwidth=bandwidth,
        memory_bytes=int(memory),
        alignment=1,
        op_overhead_seconds=_CPU_OP_OVERHEAD,
        slow_penalty=6.0,
        source=source,
        detected=detected,
    )


# name, display name, float32 and bfloat16 FLOP/cycle/core (None: no native bfloat16) of a
# nominal CPU (`cpu_profile`'s defaults: 8 cores at 3 GHz, 2 FMA units): float32 AVX-512 64,
# AVX2 32; AVX512-BF16 dot products double it; AMX tiles give ~16x for bf16.
_CPU_TABLE = (
    ("cpu-amx", "CPU with AMX-BF16", 64, 1024),
    ("cpu-avx512-bf16", "CPU with AVX512-BF16", 64, 128),
    ("cpu-generic", "CPU (AVX2, no native 16-bit)", 32, None),
)
_NOMINAL = (
    "built-in table (nominal 8-core 3 GHz CPU, 50 GB/s, 32 GiB; float16 slow: TensorFlow's "
    "CPU kernels run it on Eigen fallbacks)"
)


def _builtin_profiles() -> dict[str, HardwareProfile]:
    profiles = {row[0]: _gpu_profile(row) for row in _RTX_TABLE}
    for name, (source, float8_source) in _HOPPER_SOURCES.items():
        profiles[name] = dataclasses.replace(
            profiles[name],
            source=source,
            float8_flops=1978.9 * TERA,
            float8_flops_source=float8_source or FLOAT8_RATE_SOURCES["9.0"],
        )
    for row in _CPU_TABLE:
        profiles[row[0]] = cpu_profile(*row, None, _NOMINAL)
    return profiles


BUILTIN: dict[str, HardwareProfile] = _builtin_profiles()


def normalise_name(name: str) -> str:
    text = name.lower().replace("nvidia", "").replace("geforce", "")
    return re.sub(r"[\s_\-]+", "", text)


NORMALISED = {normalise_name(name): name for name in BUILTIN}
NORMALISED.update({normalise_name(alias): target for alias, target in _ALIASES.items()})


#: The first compute capability with FP8 tensor cores (Ada; Hopper 9.0, Blackwell 10.x/12.x).
FLOAT8_MIN_CAPABILITY = (8, 9)


def _cpu_flags(cpuinfo_path: str = "/proc/cpuinfo") -> tuple[set[str], str, float | None]:
    """Returns (flags, model name, MHz) of the first processor in /proc/cpuinfo."""
    flags: set[str] = set()
    model = "CPU"
    megahertz: float | None = None
    text = ""
    with contextlib.suppress(OSError):
        text = Path(cpuinfo_path).read_text(encoding="utf-8", errors="replace")
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = set(value.split())
        elif key == "model name" and model == "CPU":
            model = value.strip()
        elif key == "cpu MHz" and megahertz is None:
            with contextlib.suppress(ValueError):
                megahertz = float(value)
    return flags, model, megahertz


def _total_memory_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
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
    "bfloat16 rate is taken equal to float32's (AMX: the tile rate) and calibrate()'s measured "
    "per-layer costs decide where bfloat16 pays"
)


def _active_backend() -> str:
    """Returns the active Keras backend name (`"tensorflow"` if Keras cannot say)."""
    with contextlib.suppress(Exception):
        import keras

        return str(keras.backend.backend())
    return "tensorflow"


#: The CPU flags that decide 16-bit speed, in the order they are reported.
CPU_16BIT_FLAGS = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")
#: 16-bit FLOP/cycle/core of a detected CPU: (dtype, flag, fixed, times float32's), strongest first.
_CPU_16BIT_RATES = (
    (BFLOAT16, "amx_bf16", 1024, 0),
    (BFLOAT16, "avx512_bf16", 0, 1),
    (FLOAT16, "amx_fp16", 1024, 0),
    (FLOAT16, "avx512_fp16", 0, 2),
)

#: The built-in CPU class a detected CPU's strongest bfloat16 flag puts it in.
_CPU_CLASSES = (("amx_bf16", "cpu-amx"), ("avx512_bf16", "cpu-avx512-bf16"))


def _cpu_per_cycle(dtype: str, flags: set[str], float32_per_cycle: float) -> float | None:
    """The `dtype` FLOP/cycle/core the strongest of `flags` gives, or `None`."""
    for rate_dtype, flag, fixed, times in _CPU_16BIT_RATES:
        if rate_dtype == dtype and flag in flags:
            return fixed + times * float32_per_cycle
    return None


def detect_cpu(cpuinfo_path: str = "/proc/cpuinfo", backend: str | None = None) -> HardwareProfile:
    """Returns a profile of the local CPU from its feature flags, with estimated rates."""
    backend = backend or _active_backend()
    flags, model, megahertz = _cpu_flags(cpuinfo_path)
    cores = os.cpu_count() or 1
    hertz = (megahertz or 2500.0) * 1e6
    float32_per_cycle = 64 if "avx512f" in flags else (32 if "avx2" in flags else 16)
    bfloat16_per_cycle = _cpu_per_cycle(BFLOAT16, flags, float32_per_cycle)
    float16_per_cycle = None  # TensorFlow runs float16 on CPU fallback kernels
    if backend != "tensorflow":
        float16_per_cycle = _cpu_per_cycle(FLOAT16, flags, float32_per_cycle)
    base = next((name for flag, name in _CPU_CLASSES if flag in flags), "cpu-generic")
    wanted = ", ".join(flag for flag in CPU_16BIT_FLAGS if flag in flags)
    # The source says what was read, what is estimated and why.
    parts = [
        f"read from device: {model}, {cores} cores, flags {wanted or 'none of the 16-bit ones'}",
        f"estimated: peak rates from flags x {hertz / 1e9:.2f} GHz x cores, bandwidth "
        f"{cores * 10} GB/s assumed (class {base})",
    ]
    if base != "cpu-generic":
        parts.append(_CPU_BFLOAT16_NOTE)
    if backend == "tensorflow":
        parts.append(_TF_CPU_FLOAT16_NOTE)
    elif float16_per_cycle is not None:
        parts.append(f"float16 fast from CPU flags only, not measured on the {backend} backend")
    return cpu_profile(
        "local-cpu",
        model,
        float32_per_cycle,
        bfloat16_per_cycle,
        float16_per_cycle,
        "; ".join(parts),
        cores=cores,
        hertz=hertz,
        bandwidth=min(cores * 10 * GIGA, 200 * GIGA),
        memory=_total_memory_bytes() or CPU_MEMORY,
        detected=True,
    )


def cpu_flags() -> dict[str, bool]:
    """Returns the 16-bit-relevant flags of the local CPU as read from /proc/cpuinfo."""
    flags, _, _ = _cpu_flags()
    return {flag: flag in flags for flag in CPU_16BIT_FLAGS}


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
    memory = None
    with contextlib.suppress(Exception):  # the memory is optional
        memory = int((device.memory_stats() or {}).get("bytes_limit")) or None
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
        found = None
        with contextlib.suppress(Exception):  # a framework not installed or not working here
            found = readers[index]()
        if found is not None:
            return found
    return None


def profile_for_gpu(
    device_name: str, compute_capability: str | None = None, memory_bytes: int | None = None
) -> HardwareProfile:
    """Maps a GPU's reported name to its built-in profile, or builds one from what is known."""
    key = normalise_name(device_name)
    exact = NORMALISED.get(key, "")
    # The two RTX 4060 Ti share one name: their memory tells them apart (below).
    if exact not in BUILTIN or BUILTIN[exact].kind != "gpu" or exact.startswith("rtx4060ti"):
        exact = ""
    gpus = (name for name in BUILTIN if BUILTIN[name].kind == "gpu" and name.split("-")[0] in key)
    name = "" if exact else max(gpus, key=len, default="")
    if name.startswith("rtx4060ti"):
        big = (memory_bytes or 0) > 12 * GIB or "16gb" in key
        exact = "rtx4060ti-16gb" if big else "rtx4060ti-8gb"
    elif name and re.search(re.escape(name.split("-")[0]) + r"(?![0-9a-z])", key):
        exact = name
    if not exact:
        return _estimated_gpu(device_name, compute_capability, memory_bytes)
    profile = BUILTIN[exact]
    return dataclasses.replace(
        profile, detected=True, source=f"{profile.source}; device {device_name!r}"
    )


def _estimated_gpu(
    device_name: str, compute_capability: str | None, memory_bytes: int | None
) -> HardwareProfile:
    major_text, _, minor_text = str(compute_capability or "").partition(".")
    capability: tuple[int, int] | None = None  # `(major, minor)` of a capability such as "8.9"
    with contextlib.suppress(ValueError):
        capability = (int(major_text), int(minor_text or 0))
    major = capability[0] if capability else 0
    references = {7: "rtx2080ti", 9: "h100", 10: "rtx5080", 12: "rtx5080"}
    base = BUILTIN["rtx4080" if capability == (8, 9) else references.get(major, "rtx3080")]
    fast = tuple(
        dtype
        for dtype, needed in ((FLOAT16, 7), (BFLOAT16, 8))
        if major >= needed or (major == 0 and dtype == FLOAT16)
    )
    slow = tuple(dtype for dtype in (FLOAT16, BFLOAT16) if dtype not in fast)
    float8 = (capability or (0,)) >= FLOAT8_MIN_CAPABILITY and base.float8_flops is not None
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
    """Returns the profile of the device this process computes on: its first GPU, else the CPU."""
    return _detect(_active_backend())


@functools.cache
def _detect(backend: str) -> HardwareProfile:
    """The device of `detect()`, read once per process and backend (reading a GPU can take seconds)."""
    gpu = _local_gpu(backend)  # (device name, compute capability, memory bytes or None)
    return detect_cpu(backend=backend) if gpu is None else profile_for_gpu(*gpu)


#: The `hardware=` names of this device.
_LOCAL_NAMES = ("local", "detect", "auto")


def names() -> list[str]:
    """Returns the names of the built-in hardware profiles."""
    return list(BUILTIN)


def get(name: str) -> HardwareProfile:
    """Returns a built-in profile by name, ignoring case, spaces, `-` and `_`."""
    if not isinstance(name, str) or not name.strip():
        raise HardwareError(f"hardware name must be a non-empty string, got {name!r}.")
    if name.strip().lower() in _LOCAL_NAMES:
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
    """Returns the `HardwareProfile` that a `hardware=` argument names: the one resolver."""
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
    """Returns whether a `hardware=` argument means this device: `"local"`, or a detected profile."""
    if isinstance(hardware, HardwareProfile):
        return bool(hardware.detected)
    return hardware is None or (
        isinstance(hardware, str) and hardware.strip().lower() in _LOCAL_NAMES
    )
