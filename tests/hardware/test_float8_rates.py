"""Tests of float8 in hardware profiles: FP8 rates and their sources, support, files, detection."""

from __future__ import annotations

import json

import pytest

from autoprec import hardware
from autoprec.errors import HardwareError
from autoprec.hardware import FAST, UNSUPPORTED

GIB = 1024**3
TERA = 1e12

ADA = ["rtx4060ti-8gb", "rtx4060ti-16gb", "rtx4070", "rtx4080", "rtx4090"]
BLACKWELL = ["rtx5070", "rtx5080", "rtx5090"]
WITHOUT_FLOAT8 = ["rtx2060", "rtx2080ti", "rtx3060", "rtx3080", "rtx3090"]
CPUS = ["cpu-amx", "cpu-avx512-bf16", "cpu-generic"]


def test_geforce_fp8_rates_are_twice_the_bfloat16_rate_with_their_whitepapers():
    rtx4090 = hardware.get("rtx4090")
    assert rtx4090.float8_flops == pytest.approx(330e12, rel=2e-3)
    assert rtx4090.peak_flops("float8") == pytest.approx(2 * 165.2e12)
    assert "NVIDIA Ada GPU Architecture whitepaper" in rtx4090.float8_flops_source
    rtx5090 = hardware.get("rtx5090")
    assert rtx5090.float8_flops == pytest.approx(419e12)
    assert "NVIDIA RTX Blackwell GPU Architecture whitepaper" in rtx5090.float8_flops_source
    for name in ADA + BLACKWELL:
        profile = hardware.get(name)
        assert profile.float8_flops == pytest.approx(2 * profile.bfloat16_flops), name
        assert profile.supports_float8 and profile.support("float8") == FAST, name
        assert "whitepaper" in profile.float8_flops_source, name


@pytest.mark.parametrize(
    "name, memory_gib, bandwidth, extra_source",
    [("h100", 80, 3350e9, "80 GB HBM3 at 3.35 TB/s"), ("h200", 141, 4800e9, "H200")],
)
def test_hopper_profiles_pin_their_figures_and_sources(name, memory_gib, bandwidth, extra_source):
    profile = hardware.get(name)
    assert profile.kind == "gpu" and profile.compute_capability == "9.0"
    assert profile.bfloat16_flops == pytest.approx(989e12, rel=1e-3)
    assert profile.float16_flops == profile.bfloat16_flops
    assert profile.float8_flops == pytest.approx(1979e12, rel=1e-3)
    assert profile.float32_flops == pytest.approx(66.9e12)
    assert profile.memory_bandwidth == pytest.approx(bandwidth)
    assert profile.memory_bytes == memory_gib * GIB
    assert "NVIDIA H100 Tensor Core GPU Architecture whitepaper" in profile.source
    assert extra_source in profile.source
    assert "NVIDIA H100 Tensor Core GPU Architecture whitepaper" in profile.float8_flops_source
    assert profile.search_dtypes == ("float32", "bfloat16", "float16", "float8")
    assert f"float8 {profile.float8_flops / TERA:.1f}" in profile.summary()
    assert hardware.get(name.upper() + " SXM").name == name


@pytest.mark.parametrize("name", WITHOUT_FLOAT8 + CPUS)
def test_turing_ampere_and_cpus_have_no_float8(name):
    profile = hardware.get(name)
    assert profile.float8_flops is None and profile.float8_flops_source is None
    assert profile.support("float8") == UNSUPPORTED and not profile.supports_float8
    assert "float8" not in profile.search_dtypes and "float8" not in profile.fast_dtypes
    assert profile.peak_flops("float8") == profile.float32_flops
    assert "float8 unsupported" in profile.summary()


def test_search_dtypes_hold_float8_only_with_a_rate():
    assert hardware.get("rtx4090").search_dtypes == ("float32", "bfloat16", "float16", "float8")
    assert hardware.get("rtx3090").search_dtypes == ("float32", "bfloat16", "float16")
    assert hardware.get("rtx2080ti").search_dtypes == ("float32", "float16")


def test_detected_cpus_never_have_float8(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    flags = "avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_fp16 amx_tile"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: {flags}\n")
    for backend in ("tensorflow", "jax"):
        profile = hardware.detect_cpu(str(cpuinfo), backend=backend)
        assert not profile.supports_float8 and profile.float8_flops is None
    local = hardware.detect()
    if local.kind == "cpu":
        assert not local.supports_float8


@pytest.mark.parametrize(
    "device, capability, expected_name, float8",
    [
        ("NVIDIA H200", "9.0", "h200", True),
        ("NVIDIA H100 80GB HBM3", "9.0", "h100", True),
        ("NVIDIA GeForce RTX 4090", "8.9", "rtx4090", True),
        ("NVIDIA GeForce RTX 5090", "12.0", "rtx5090", True),
        ("NVIDIA GeForce RTX 3090", "8.6", "rtx3090", False),
    ],
)
def test_known_gpus_are_detected_with_their_float8(device, capability, expected_name, float8):
    profile = hardware.profile_for_gpu(device, capability)
    assert profile.name == expected_name and profile.detected
    assert profile.supports_float8 is float8
    assert device in profile.source


@pytest.mark.parametrize(
    "device, capability, float8",
    [
        ("NVIDIA L40S", "8.9", True),
        ("NVIDIA H100 PCIe", "9.0", True),
        ("NVIDIA B200", "10.0", True),
        ("NVIDIA A100-SXM4-80GB", "8.0", False),
        ("NVIDIA A10G", "8.6", False),
        ("Tesla T4", "7.5", False),
        ("Mystery GPU", None, False),
    ],
)
def test_unknown_gpus_have_float8_from_compute_capability_8_9(device, capability, float8):
    profile = hardware.profile_for_gpu(device, capability)
    assert "estimated" in profile.source
    assert profile.supports_float8 is float8
    if float8:
        assert profile.float8_flops_source.startswith("estimated: copied from")
    else:
        assert profile.float8_flops is None


def test_hopper_of_unknown_name_copies_the_h100():
    profile = hardware.profile_for_gpu("NVIDIA GH200 480GB", "9.0")
    assert profile.float8_flops == hardware.get("h100").float8_flops
    assert "H100" in profile.source


_OLD_FILE = {
    "name": "lab-gpu",
    "kind": "gpu",
    "compute_capability": "8.6",
    "float32_flops": 30e12,
    "float16_flops": 60e12,
    "bfloat16_flops": 60e12,
    "memory_bandwidth": 760e9,
    "memory_bytes": 10 * GIB,
    "fast_dtypes": ["float16", "bfloat16"],
    "slow_dtypes": [],
    "alignment": 8,
    "op_overhead_seconds": 5e-6,
    "slow_penalty": 8.0,
    "source": "written before float8",
}


def test_user_files_without_float8_still_load_without_it(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(_OLD_FILE))
    profile = hardware.load_profile(path)
    assert profile.is_fast("bfloat16") and not profile.supports_float8
    assert profile.float8_alignment == 16


def test_user_files_accept_a_float8_rate(tmp_path):
    path = tmp_path / "fp8.json"
    path.write_text(json.dumps({**_OLD_FILE, "compute_capability": "8.9", "float8_flops": 120e12}))
    profile = hardware.load_profile(path)
    assert profile.supports_float8 and profile.peak_flops("float8") == pytest.approx(120e12)
    assert "float8" in profile.search_dtypes
    assert "written before float8" in profile.float8_flops_source


def test_saved_profiles_keep_their_float8_rate_and_source(tmp_path):
    original = hardware.get("h200")
    loaded = hardware.load_profile(original.save(tmp_path / "h200.json"))
    assert loaded.float8_flops == original.float8_flops
    assert loaded.float8_flops_source == original.float8_flops_source
    assert loaded.supports_float8


@pytest.mark.parametrize(
    "change, field",
    [
        ({"fast_dtypes": ["float8"]}, "float8_flops"),
        ({"float8_flops": -1.0}, "float8_flops"),
        ({"float8_flops": 1e12, "float8_alignment": 0}, "float8_alignment"),
        ({"slow_dtypes": ["float8"]}, "slow_dtypes"),
        ({"fast_dtypes": ["int8"]}, "fast_dtypes"),
    ],
)
def test_user_file_float8_errors_name_the_field(tmp_path, change, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**_OLD_FILE, **change}))
    with pytest.raises(HardwareError, match=field):
        hardware.load_profile(path)
