"""Tests for autoprec.profiler.profile_json: the names a profile uses and its JSON, written and read back with clear errors."""

from __future__ import annotations

import dataclasses
import json

import pytest
from profiler.reference import synthetic_profile

from autoprec import numerics
from autoprec.errors import ProfileError
from autoprec.profiler import (
    Float8Ranges,
    Float8TensorRange,
    LayerProfile,
    Profile,
    TensorStats,
    profile_json,
    stats,
)
from autoprec.profiler.profile_json import (
    ATTENTION_LOGITS,
    FLOAT8_FORMAT_NAMES,
    FLOAT8_TENSORS,
    OUTPUT_KEY,
    ROOT_PATH,
    TENSOR_KINDS,
)


def test_json_round_trip(tmp_path):
    prof = synthetic_profile()
    path = prof.save(tmp_path / "profile.json")
    loaded = Profile.load(path)
    assert loaded.to_dict() == prof.to_dict()
    assert json.loads(path.read_text())["format_version"] == 1
    assert Profile.from_json(prof.to_json()).to_dict() == prof.to_dict()
    assert not loaded.layers["attention"].float16_safe
    assert loaded.layers["encoder/dense"].float16_safe


def test_malformed_profiles_raise_clear_errors(tmp_path):
    text = synthetic_profile().to_json()
    truncated = tmp_path / "truncated.json"
    truncated.write_text(text[: len(text) // 2])
    with pytest.raises(ProfileError, match="truncated.json.*not valid JSON"):
        Profile.load(truncated)
    with pytest.raises(ProfileError, match="no such file"):
        Profile.load(tmp_path / "missing.json")

    def broken(edit) -> str:
        data = json.loads(text)
        edit(data)
        return json.dumps(data)

    cases = {
        "format_version": lambda d: d.pop("format_version"),
        "layers\\['attention'\\].internals\\['attention_logits'\\].count": lambda d: d["layers"][
            "attention"
        ]["internals"]["attention_logits"].update(count="many"),
        "exponents": lambda d: d["layers"]["attention"]["activations"]["output"][
            "exponents"
        ].update({"900": 1}),
        "does not equal": lambda d: d["layers"]["encoder/dense"]["weights"]["kernel"].update(
            count=99
        ),
        "not supported": lambda d: d.update(format_version=99),
    }
    for message, edit in cases.items():
        with pytest.raises(ProfileError, match=message):
            Profile.from_json(broken(edit), source="edited.json")


def test_each_level_is_written_and_read_by_its_function():
    prof = synthetic_profile()
    data = prof.to_dict()
    assert data["kind"] == profile_json.FORMAT_KIND
    assert data["format_version"] == profile_json.FORMAT_VERSION
    again = Profile.from_dict(data, "p.json")
    assert isinstance(again, Profile) and again.to_dict() == data
    layer = prof.layers["attention"]
    entry = layer.to_dict()
    assert "float8" not in entry
    read = LayerProfile.from_dict("attention", entry, "here")
    assert read.path == "attention" and read.to_dict() == entry
    logits = layer.internals["attention_logits"]
    written = logits.to_dict()
    assert written["exponents"] == {str(k): v for k, v in logits.exponent_counts().items()}
    assert TensorStats.from_dict(written, "here").to_dict() == written
    # A layer written before dtypes or float8 ranges were recorded reads with the defaults.
    old = LayerProfile.from_dict("x", {"class_name": "Dense"}, "here")
    assert old.dtype == "float32" and old.float8 is None and old.forward is None


def test_float8_ranges_round_trip_and_refuse_unknown_tensors_and_formats():
    kernel = Float8TensorRange("float8_e4m3fn", 2.0, 100, 0, 0.01, None, None, 0)
    grads = Float8TensorRange("float8_e5m2", 3e4, 50, 1, 0.0, 0.002, 1.5, 6)
    ranges = Float8Ranges(kernel=kernel, output_gradients=grads)
    data = ranges.to_dict()
    assert list(data) == ["kernel", "output_gradients"]
    assert data["kernel"] == dataclasses.asdict(kernel)
    assert Float8Ranges.from_dict(data, "here") == ranges
    assert Float8TensorRange.from_dict(data["kernel"], "k") == kernel
    with pytest.raises(ProfileError, match=r"here: unknown float8 tensor\(s\) 'bias'"):
        Float8Ranges.from_dict({**data, "bias": {}}, "here")
    with pytest.raises(ProfileError, match=r"k\.format: expected one of float8_e4m3fn"):
        Float8TensorRange.from_dict({**data["kernel"], "format": "int8"}, "k")
    with pytest.raises(ProfileError, match=r"k\.saturation_fraction: expected a finite number"):
        Float8TensorRange.from_dict({**data["kernel"], "saturation_fraction": "high"}, "k")


def test_the_tensor_kinds_are_the_layer_profile_groups():
    fields = [field.name for field in dataclasses.fields(stats.LayerProfile)]
    assert [name for name in fields if name in TENSOR_KINDS] == list(TENSOR_KINDS)
    assert (OUTPUT_KEY, ATTENTION_LOGITS, ROOT_PATH) == ("output", "attention_logits", "<model>")


def test_float8_tensors_are_the_float8_ranges_fields_with_their_formats():
    assert list(FLOAT8_TENSORS) == [field.name for field in dataclasses.fields(Float8Ranges)]
    assert {fmt for fmt, _ in FLOAT8_TENSORS.values()} == set(FLOAT8_FORMAT_NAMES)
    assert FLOAT8_TENSORS["output_gradients"][0] == numerics.FLOAT8_E5M2.name
    assert FLOAT8_FORMAT_NAMES[numerics.FLOAT8_E4M3.name] == "E4M3"


def test_the_names_stay_importable_from_stats():
    # docs/api.md names these as autoprec.profiler.stats.<name>.
    assert stats.FLOAT8_TENSORS is FLOAT8_TENSORS and stats.TENSOR_KINDS is TENSOR_KINDS
    assert (stats.OUTPUT_KEY, stats.ATTENTION_LOGITS) == (OUTPUT_KEY, ATTENTION_LOGITS)
    assert stats.Float8Ranges is Float8Ranges and stats.Float8TensorRange is Float8TensorRange
    assert stats.FORMAT_VERSION == 1
