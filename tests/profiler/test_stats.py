"""Tests for autoprec.profiler.stats: layer and profile judgements, the summary."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from profiler.reference import synthetic_profile

from autoprec import numerics
from autoprec.profiler import LayerProfile, TensorStats


def test_summary_lists_the_riskiest_layer_first():
    prof = synthetic_profile()
    table = prof.summary()
    assert table.splitlines()[3].startswith("attention")  # riskiest first
    assert "NO" in table and "yes" in table


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
