"""Built-in profiles: NVIDIA RTX cards and Hopper GPUs (whitepaper figures), nominal CPU classes."""

from __future__ import annotations

import re

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16
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

#: Where the FP8 rate of each GPU architecture with FP8 tensor cores comes from, by compute
#: capability. GeForce Ada and Blackwell run FP8 with float32 accumulate at 2x their
#: FP16/BF16-with-float32-accumulate rate (the table's BF16 TC column): RTX 4090 330.4,
#: RTX 5090 419.0 dense TFLOPS. Turing (7.5) and Ampere (8.6) have no FP8 tensor cores.
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

# Hopper (CC 9.0): name, display name, VRAM GB, GB/s, FP32, FP16/BF16 TC, FP8 TC (dense
# TFLOPS, float32 accumulate; datacenter parts run FP16 with float32 accumulate at full
# rate), source of the figures, source of the FP8 rate.
_HOPPER_TABLE: tuple[tuple[str, str, float, float, float, float, float, str, str], ...] = (
    (
        "h100",
        "NVIDIA H100 SXM5 80GB",
        80,
        3350,
        66.9,
        989.4,
        1978.9,
        "built-in table (NVIDIA H100 Tensor Core GPU Architecture whitepaper, H100 SXM5: "
        "66.9 FP32, 989.4 dense FP16/BF16, 1978.9 dense FP8 TFLOPS, 80 GB HBM3 at 3.35 TB/s)",
        FLOAT8_RATE_SOURCES["9.0"],
    ),
    (
        "h200",
        "NVIDIA H200 SXM 141GB",
        141,
        4800,
        66.9,
        989.4,
        1978.9,
        "built-in table (NVIDIA H200 Tensor Core GPU datasheet: 141 GB HBM3e at 4.8 TB/s; "
        "compute of the H100 SXM5 in the NVIDIA H100 Tensor Core GPU Architecture whitepaper)",
        "NVIDIA H200 Tensor Core GPU datasheet: FP8 Tensor 3958 TFLOPS with sparsity, 1978.9 "
        "dense, the H100 SXM5's (NVIDIA H100 Tensor Core GPU Architecture whitepaper)",
    ),
)

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
    float8_source = FLOAT8_RATE_SOURCES.get(capability)
    float8 = None if float8_source is None or bf16 is None else 2 * bf16
    if float8 is not None:
        fast = (*fast, FLOAT8)
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
        float8_flops=None if float8 is None else float8 * TERA,
        float8_flops_source=float8_source,
    )


def _hopper_profile(row: tuple) -> HardwareProfile:
    name, display, vram_gb, bandwidth_gbs, fp32, half, float8, source, float8_source = row
    return HardwareProfile(
        name=name,
        display_name=display,
        kind="gpu",
        compute_capability="9.0",
        float32_flops=fp32 * TERA,
        float16_flops=half * TERA,
        bfloat16_flops=half * TERA,
        memory_bandwidth=bandwidth_gbs * GIGA,
        memory_bytes=int(vram_gb * GIB),
        fast_dtypes=(FLOAT16, BFLOAT16, FLOAT8),
        alignment=8,
        op_overhead_seconds=5e-6,
        slow_penalty=8.0,
        source=source,
        float8_flops=float8 * TERA,
        float8_flops_source=float8_source,
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
    profiles.update({row[0]: _hopper_profile(row) for row in _HOPPER_TABLE})
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
