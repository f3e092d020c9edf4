"""Tests for autoprec.profiler.stats: statistics from raw accumulators, judgements, JSON."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import tensorflow as tf
from profiler.reference import assert_matches_reference, synthetic_profile

from autoprec import numerics
from autoprec._backends import tensorflow as tf_backend
from autoprec.errors import ProfileError
from autoprec.profiler import LayerProfile, Profile, TensorStats

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


def _stats(values) -> TensorStats:
    values = np.asarray(values, np.float32)
    histogram, zeros, nonfinite = numerics.exponent_histogram(values)
    finite = np.abs(values[np.isfinite(values)]).astype(np.float64)
    nonzero = finite[finite > 0]
    return TensorStats(
        count=values.size,
        zeros=zeros,
        nonfinite=nonfinite,
        nan=int(np.isnan(values).sum()),
        max_abs=float(finite.max()) if finite.size else 0.0,
        min_nonzero_abs=float(nonzero.min()) if nonzero.size else None,
        sum_abs=float(finite.sum()),
        sum_squares=float((finite**2).sum()),
        histogram=histogram,
    )


def _layer(forward=None, gradient=None) -> LayerProfile:
    return LayerProfile(
        path="layer",
        class_name="Dense",
        dtype="float32",
        activations={} if forward is None else {"output": _stats(forward)},
        activation_gradients={} if gradient is None else {"output": _stats(gradient)},
        weights={},
        weight_gradients={},
        internals={},
    )


def test_float16_unsafe_reason_names_the_failing_test_and_agrees_with_float16_safe():
    cases = {
        "non-finite forward": _layer(forward=[1.0, np.inf, np.nan]),
        "above float16's max": _layer(forward=[1.0, 7e4]),
        "flush to zero": _layer(forward=[1.0, 1e-9, 2e-9]),
        "non-finite gradient": _layer(forward=[1.0], gradient=[1e-3, np.nan]),
        "no float16 loss scale": _layer(forward=[1.0], gradient=[1e4, 1e-30, 2e-30]),
        None: _layer(forward=[0.5, -2.0], gradient=[1e-3, 2e-4]),
    }
    for expected, layer in cases.items():
        reason = layer.float16_unsafe_reason
        assert (reason is None) == layer.float16_safe, (expected, reason)
        if expected is None:
            assert reason is None
        else:
            assert expected in reason
    assert _layer().float16_unsafe_reason is None and _layer().float16_safe


def test_profile_lists_unsafe_layers_with_reasons_and_is_frozen():
    prof = synthetic_profile()
    assert prof.float16_unsafe_layers == ("attention",)
    assert list(prof.float16_unsafe_reasons) == ["attention"]
    assert "above float16's max 65504" in prof.float16_unsafe_reasons["attention"]
    for path, layer in prof.layers.items():
        assert (layer.float16_unsafe_reason is None) == layer.float16_safe, path
    with pytest.raises(dataclasses.FrozenInstanceError):
        prof.steps = 5
    with pytest.raises(TypeError):
        prof.layers["other"] = prof.layers["attention"]
    assert "float16_unsafe=1" in repr(prof)
