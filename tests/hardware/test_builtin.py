"""Tests for the built-in profiles and the look-ups of `resolve_hardware`: the RTX table, names, errors."""

from __future__ import annotations

import pytest

from autoprec import hardware
from autoprec.errors import HardwareError
from autoprec.hardware import SLOW

RTX_NAMES = [
    "rtx2060",
    "rtx2080ti",
    "rtx3060",
    "rtx3080",
    "rtx3090",
    "rtx4060ti-8gb",
    "rtx4060ti-16gb",
    "rtx4070",
    "rtx4080",
    "rtx4090",
    "rtx5070",
    "rtx5080",
    "rtx5090",
]
GIB = 1024**3


def test_names_cover_the_rtx_table_and_cpu_classes():
    names = hardware.names()
    for name in RTX_NAMES + ["cpu-avx512-bf16", "cpu-amx", "cpu-generic"]:
        assert name in names


@pytest.mark.parametrize(
    "spelling, expected",
    [
        ("rtx4090", "rtx4090"),
        ("RTX 4090", "rtx4090"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("rtx_2080_ti", "rtx2080ti"),
        ("RTX 4060 Ti", "rtx4060ti-8gb"),
        ("rtx 4060 ti 16gb", "rtx4060ti-16gb"),
        ("CPU-AMX", "cpu-amx"),
    ],
)
def test_get_ignores_case_spaces_and_separators(spelling, expected):
    assert hardware.get(spelling).name == expected


def test_table_figures_match_the_design_table():
    rtx4090 = hardware.get("rtx4090")
    assert rtx4090.kind == "gpu" and rtx4090.compute_capability == "8.9"
    assert rtx4090.float32_flops == pytest.approx(82.6e12)
    assert rtx4090.peak_flops("float16") == pytest.approx(165.2e12)
    assert rtx4090.peak_flops("bfloat16") == pytest.approx(165.2e12)
    assert rtx4090.memory_bandwidth == pytest.approx(1008e9)
    assert rtx4090.memory_bytes == 24 * GIB
    assert rtx4090.alignment == 8
    assert hardware.get("rtx4060ti-8gb").memory_bytes == 8 * GIB
    assert hardware.get("rtx4060ti-16gb").memory_bytes == 16 * GIB
    assert hardware.get("rtx5090").compute_capability == "12.0"
    assert rtx4090.source == "built-in table"


@pytest.mark.parametrize("name", ["rtx2060", "rtx2080ti"])
def test_turing_has_no_fast_bfloat16(name):
    profile = hardware.get(name)
    assert profile.is_fast("float16")
    assert not profile.is_fast("bfloat16")
    assert profile.support("bfloat16") == SLOW
    assert profile.bfloat16_flops is None
    assert profile.peak_flops("bfloat16") == profile.float32_flops


def test_ampere_and_later_have_fast_bfloat16():
    for name in RTX_NAMES[2:]:
        assert hardware.get(name).is_fast("bfloat16"), name


def test_unknown_name_lists_known_profiles_and_closest_match():
    with pytest.raises(HardwareError) as raised:
        hardware.get("rtx 4091")
    message = str(raised.value)
    assert "Did you mean 'rtx4090'" in message
    assert "rtx2060" in message and "cpu-generic" in message


def test_get_rejects_empty_name():
    with pytest.raises(HardwareError):
        hardware.get("  ")
