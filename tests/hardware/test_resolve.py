"""Tests for autoprec.hardware: the one resolver of `hardware=`."""

from __future__ import annotations

import json

import pytest

from autoprec import hardware
from autoprec.errors import HardwareError


def test_names_and_objects_resolve_to_profiles():
    rtx = hardware.resolve_hardware("RTX 4090")
    assert rtx.name == "rtx4090"
    assert hardware.resolve_hardware(rtx) is rtx


@pytest.mark.parametrize("value", [None, "local", "LOCAL", " detect "])
def test_local_means_this_device(value):
    assert hardware.is_local(value)
    assert hardware.resolve_hardware(value).detected


@pytest.mark.parametrize("value", ["rtx4090", "cpu-avx512-bf16"])
def test_named_profiles_are_not_local(value):
    assert not hardware.is_local(value)
    assert not hardware.resolve_hardware(value).detected


def test_a_json_file_resolves_to_the_user_profile(tmp_path):
    path = tmp_path / "card.json"
    path.write_text(
        json.dumps(
            {
                "name": "lab-card",
                "kind": "gpu",
                "float32_flops": 1e13,
                "memory_bandwidth": 5e11,
                "memory_bytes": 8 * 1024**3,
            }
        )
    )
    assert hardware.resolve_hardware(str(path)).name == "lab-card"


def test_other_types_are_refused_with_what_is_accepted():
    with pytest.raises(HardwareError, match="'local', a profile name"):
        hardware.resolve_hardware(42)
    with pytest.raises(HardwareError, match="Known profiles"):
        hardware.resolve_hardware("rtx9999")
