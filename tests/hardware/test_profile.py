"""Tests for autoprec.hardware: user profile files, defaults, errors, summaries."""

from __future__ import annotations

import json

import pytest

from autoprec import hardware
from autoprec.errors import HardwareError
from autoprec.hardware import UNSUPPORTED

GIB = 1024**3


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
    assert profile.is_fast("float16") and profile.support("bfloat16") == UNSUPPORTED
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
