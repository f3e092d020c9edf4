"""Tests for autoprec.profiler.stats: statistics from raw accumulators, judgements, JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from profiler.reference import assert_matches_reference, synthetic_profile

from autoprec._backends import tensorflow as tf_backend
from autoprec.errors import ProfileError
from autoprec.profiler import Profile, TensorStats

_SPECIAL_VALUES = np.array(
    [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        1.0,
        np.nextafter(np.float32(1.0), np.float32(0.0)),
        -(2.0**-14),
        6.0e-8,
        1e-40,  # float32 subnormal
        -1.4e-45,  # smallest float32 subnormal
        3e30,  # forces the rescaled branch for the sums
        65504.0,
        70000.0,
    ],
    dtype=np.float32,
)


_KNOWN_TENSORS = {
    "normal": np.random.default_rng(1).normal(scale=3.0, size=(5, 7, 11)).astype(np.float32),
    "special": np.concatenate([_SPECIAL_VALUES, np.linspace(-5, 5, 50, dtype=np.float32)]),
    "zeros": np.zeros((4, 3), np.float32),
    "subnormal": np.array([1e-41, 0.0, 2e-39], np.float32),  # only subnormals and zeros
}


@pytest.mark.parametrize("xla", [False, True], ids=["graph", "xla"])
def test_statistics_of_known_tensors_match_numpy(xla):
    for name, values in _KNOWN_TENSORS.items():
        accumulator = tf_backend.TensorAccumulator(name)

        @tf.function(jit_compile=xla)
        def update(tensor, accumulator=accumulator):
            accumulator.update(tensor, xla)

        update(tf.constant(values))
        update(tf.constant(values))
        stats = TensorStats.from_raw(*accumulator.read())
        assert_matches_reference(stats, np.concatenate([values.ravel(), values.ravel()]))


def test_statistics_of_half_precision_tensors_are_exact():
    values = np.array([65504.0, 6e-8, 2.0**-24, 1.0, -3.5, 0.0], np.float32)
    for dtype in ("float16", "bfloat16"):
        accumulator = tf_backend.TensorAccumulator(dtype)
        tensor = tf.cast(tf.constant(values), dtype)
        accumulator.update(tensor, xla=False)
        stats = TensorStats.from_raw(*accumulator.read())
        assert_matches_reference(stats, tf.cast(tensor, "float32").numpy())


def test_json_round_trip_and_summary(tmp_path):
    prof = synthetic_profile()
    path = prof.save(tmp_path / "profile.json")
    loaded = Profile.load(path)
    assert loaded.to_dict() == prof.to_dict()
    assert json.loads(path.read_text())["format_version"] == 1
    assert Profile.from_json(prof.to_json()).to_dict() == prof.to_dict()
    table = prof.summary()
    assert table.splitlines()[3].startswith("attention")  # riskiest first
    assert "NO" in table and "yes" in table
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
