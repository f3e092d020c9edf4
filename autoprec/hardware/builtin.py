"""Built-in profiles: consumer NVIDIA RTX cards (whitepaper figures) and nominal CPU classes."""

from __future__ import annotations

import re

from .._core.dtypes import BFLOAT16, FLOAT16
from .profile import GIB, GIGA, TERA, HardwareProfile

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
_CPU_BANDWIDTH = 50 * GIGA
CPU_MEMORY = 32 * GIB
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
        float32_flops=fp32 * TERA,
        float16_flops=fp16 * TERA,
        bfloat16_flops=None if bf16 is None else bf16 * TERA,
        memory_bandwidth=bandwidth_gbs * GIGA,
        memory_bytes=int(vram_gb * GIB),
        fast_dtypes=fast,
        slow_dtypes=slow,
        alignment=8,
        op_overhead_seconds=5e-6,
        slow_penalty=8.0,
        source="built-in table",
    )


def cpu_profile(
    name: str,
    display: str,
    float32_per_cycle: float,
    bfloat16_per_cycle: float | None,
    float16_per_cycle: float | None,
    source: str,
    cores: int = _CPU_CORES,
    hertz: float = _CPU_HZ,
    bandwidth: float = _CPU_BANDWIDTH,
    memory: int = CPU_MEMORY,
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
    profiles["cpu-amx"] = cpu_profile("cpu-amx", "CPU with AMX-BF16", 64, 1024, None, _NOMINAL)
    profiles["cpu-avx512-bf16"] = cpu_profile(
        "cpu-avx512-bf16", "CPU with AVX512-BF16", 64, 128, None, _NOMINAL
    )
    profiles["cpu-generic"] = cpu_profile(
        "cpu-generic", "CPU (AVX2, no native 16-bit)", 32, None, None, _NOMINAL
    )
    return profiles


BUILTIN: dict[str, HardwareProfile] = _builtin_profiles()


def normalise_name(name: str) -> str:
    text = name.lower().replace("nvidia", "").replace("geforce", "")
    return re.sub(r"[\s_\-]+", "", text)


NORMALISED = {normalise_name(name): name for name in BUILTIN}
NORMALISED.update({normalise_name(alias): target for alias, target in _ALIASES.items()})
