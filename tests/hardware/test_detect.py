"""Tests for the detection of this device: CPU flags from /proc/cpuinfo, GPU names to profiles."""

from __future__ import annotations

from pathlib import Path

import keras
import pytest

from autoprec import hardware
from autoprec.hardware import SLOW

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


def test_detect_is_consistent_with_proc_cpuinfo():
    profile = hardware.detect()
    assert profile.detected
    assert hardware.detect() is profile  # read once per process
    if profile.kind == "gpu":
        pytest.skip("a GPU is present; the CPU path is not taken")
    flags = _cpuinfo_flags()
    assert profile.is_fast("bfloat16") == bool({"avx512_bf16", "amx_bf16"} & flags)
    assert "estimated" in profile.source
    if keras.backend.backend() == "tensorflow":
        # TensorFlow's CPU kernels run float16 on Eigen fallbacks, whatever the flags say.
        assert profile.support("float16") == SLOW
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
    assert profile.support("float16") == SLOW
    assert profile.float16_flops is None
    assert profile.peak_flops("float16") == profile.float32_flops
    assert "float16 slow: TensorFlow's CPU kernels" in profile.source
    assert "Eigen" in profile.summary()
    for name in ("cpu-generic", "cpu-avx512-bf16", "cpu-amx"):
        builtin = hardware.get(name)
        assert builtin.support("float16") == SLOW
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
