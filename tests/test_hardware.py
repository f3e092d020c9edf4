"""Tests for autoprec.hardware: built-in table, look-up errors, detection, user files."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import pytest

from autoprec import hardware
from autoprec.errors import HardwareError

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


def _cpuinfo_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


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
    assert profile.support("bfloat16") == hardware.SLOW
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


def test_detect_is_consistent_with_proc_cpuinfo():
    profile = hardware.detect()
    assert profile.detected
    if profile.kind == "gpu":
        pytest.skip("a GPU is present; the CPU path is not taken")
    flags = _cpuinfo_flags()
    assert profile.is_fast("bfloat16") == bool({"avx512_bf16", "amx_bf16"} & flags)
    assert "estimated" in profile.source
    if keras.backend.backend() == "tensorflow":
        # TensorFlow's CPU kernels run float16 on Eigen fallbacks, whatever the flags say.
        assert profile.support("float16") == hardware.SLOW
        assert "TensorFlow" in profile.source
    assert profile.memory_bytes > 0 and profile.float32_flops > 0
    reported = hardware.cpu_flags()
    for flag, present in reported.items():
        assert present == (flag in flags)


def _fake_cpuinfo(tmp_path, flags: str) -> str:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        f"processor\t: 0\nmodel name\t: Test CPU\ncpu MHz\t\t: 2000.0\nflags\t\t: {flags}\n"
    )
    return str(cpuinfo)


@pytest.mark.parametrize(
    "flags, backend, bf16_fast, fp16_fast, ratio",
    [
        ("fpu sse avx2 fma", "tensorflow", False, False, None),
        # AVX512-BF16: a capability only; its rate is float32's (measured 0.6x-3.5x).
        ("avx2 avx512f avx512_bf16", "tensorflow", True, False, 1.0),
        ("avx2 avx512f avx512_bf16 amx_bf16 amx_tile", "tensorflow", True, False, 16.0),
        ("avx2 avx512f avx512_bf16 avx512_fp16", "tensorflow", True, False, 1.0),
        # Other backends keep the flag-based float16 claim, marked unmeasured.
        ("avx2 avx512f avx512_bf16 avx512_fp16", "torch", True, True, 1.0),
    ],
)
def test_detect_cpu_reads_flags(tmp_path, flags, backend, bf16_fast, fp16_fast, ratio):
    profile = hardware.detect_cpu(_fake_cpuinfo(tmp_path, flags), backend=backend)
    assert profile.kind == "cpu" and profile.display_name == "Test CPU"
    assert profile.is_fast("bfloat16") is bf16_fast
    assert profile.is_fast("float16") is fp16_fast
    if ratio is not None:
        assert profile.peak_flops("bfloat16") / profile.float32_flops == pytest.approx(ratio)
    assert "estimated" in profile.source
    if bf16_fast:
        assert "capability" in profile.source and "calibrate" in profile.source
    if fp16_fast:
        assert "not measured on the torch backend" in profile.source


def test_cpu_float16_is_slow_under_tensorflow_whatever_the_flags(tmp_path):
    flags = "avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_fp16 amx_tile"
    profile = hardware.detect_cpu(_fake_cpuinfo(tmp_path, flags), backend="tensorflow")
    assert profile.support("float16") == hardware.SLOW
    assert profile.float16_flops is None
    assert profile.peak_flops("float16") == profile.float32_flops
    assert "float16 slow: TensorFlow's CPU kernels" in profile.source
    assert "Eigen" in profile.summary()
    for name in ("cpu-generic", "cpu-avx512-bf16", "cpu-amx"):
        builtin = hardware.get(name)
        assert builtin.support("float16") == hardware.SLOW
        assert "float16 slow" in builtin.source


def test_profile_for_gpu_maps_known_names_and_marks_unknown_ones_estimated():
    known = hardware.profile_for_gpu("NVIDIA GeForce RTX 3090", "8.6")
    assert known.name == "rtx3090" and known.detected
    big = hardware.profile_for_gpu("NVIDIA GeForce RTX 4060 Ti", "8.9", memory_bytes=16 * GIB)
    assert big.name == "rtx4060ti-16gb"
    variant = hardware.profile_for_gpu("NVIDIA GeForce RTX 3080 Ti", "8.6")
    assert "estimated" in variant.source and variant.display_name.endswith("3080 Ti")
    turing = hardware.profile_for_gpu("Tesla T4", "7.5", memory_bytes=15 * GIB)
    assert "estimated" in turing.source
    assert turing.is_fast("float16") and not turing.is_fast("bfloat16")
    assert turing.memory_bytes == 15 * GIB
    hopper = hardware.profile_for_gpu("NVIDIA H200", "9.0")
    assert hopper.is_fast("bfloat16")


def test_user_profile_round_trip(tmp_path):
    original = hardware.get("rtx3060")
    path = original.save(tmp_path / "gpu.json")
    loaded = hardware.load_profile(path)
    assert loaded.source.startswith(f"user file: {path}")
    for field in ("name", "float32_flops", "bfloat16_flops", "memory_bytes", "fast_dtypes"):
        assert getattr(loaded, field) == getattr(original, field)
    assert hardware.get(str(path)).name == "rtx3060"


def test_minimal_user_profile_gets_defaults(tmp_path):
    path = tmp_path / "minimal.json"
    path.write_text(
        json.dumps(
            {
                "name": "lab-gpu",
                "kind": "gpu",
                "float32_flops": 10e12,
                "float16_flops": 40e12,
                "memory_bandwidth": 500e9,
                "memory_bytes": 12 * GIB,
            }
        )
    )
    profile = hardware.load_profile(path)
    assert profile.is_fast("float16") and profile.support("bfloat16") == hardware.UNSUPPORTED
    assert profile.display_name == "lab-gpu"


_VALID = {
    "name": "lab-gpu",
    "kind": "gpu",
    "float32_flops": 10e12,
    "memory_bandwidth": 500e9,
    "memory_bytes": 8e9,
}


@pytest.mark.parametrize(
    "change, field",
    [
        ({"kind": "tpu"}, "kind"),
        ({"float32_flops": -1}, "float32_flops"),
        ({"memory_bytes": "lots"}, "memory_bytes"),
        ({"memory_bandwidht": 1e9}, "memory_bandwidht"),
        ({"fast_dtypes": ["float8"]}, "fast_dtypes"),
        ({"fast_dtypes": ["bfloat16"]}, "bfloat16_flops"),
        ({"name": None}, "name"),
    ],
)
def test_user_profile_errors_name_file_and_field(tmp_path, change, field):
    path = tmp_path / "bad.json"
    data = {**_VALID, **change}
    path.write_text(json.dumps(data))
    with pytest.raises(HardwareError) as raised:
        hardware.load_profile(path)
    assert str(path) in str(raised.value)
    assert field in str(raised.value)


def test_user_profile_missing_field_and_bad_json(tmp_path):
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({k: v for k, v in _VALID.items() if k != "memory_bytes"}))
    with pytest.raises(HardwareError, match="memory_bytes"):
        hardware.load_profile(missing)
    broken = tmp_path / "broken.json"
    broken.write_text('{"name": ')
    with pytest.raises(HardwareError, match="broken.json"):
        hardware.load_profile(broken)
    with pytest.raises(HardwareError, match="no such file"):
        hardware.load_profile(tmp_path / "absent.json")


def test_summary_mentions_source_and_support():
    text = hardware.get("rtx2080ti").summary()
    assert "bfloat16 slow" in text and "built-in table" in text
