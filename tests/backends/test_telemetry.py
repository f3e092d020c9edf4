"""Tests for autoprec._backends.telemetry: both backends implement the one telemetry interface."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from autoprec._backends import tensorflow_telemetry
from autoprec._backends.telemetry import StepRecorder, TelemetryHooks


def _public_methods(cls) -> dict[str, list[str]]:
    """Public methods of `cls` and its bases (not `object`'s), with their parameter names."""
    return {
        name: list(inspect.signature(member).parameters)
        for name, member in inspect.getmembers(cls, callable)
        if not name.startswith("_") and not hasattr(object, name)
    }


def test_both_backends_offer_the_same_hooks_with_the_same_signatures():
    jax_telemetry = pytest.importorskip("autoprec._backends.jax_telemetry")
    protocol = _public_methods(TelemetryHooks)
    # The one method beyond the protocol: what the shared base's install_step puts in place.
    expected = {**protocol, "step_wrappers": ["self", "model", "recorder", "owners"]}
    for module in (tensorflow_telemetry, jax_telemetry):
        methods = _public_methods(module.TelemetryHooks)
        assert methods == expected, module.__name__
        assert isinstance(module.TelemetryHooks.measures_bfloat16_lazily, bool)
        assert list(inspect.signature(module.bitcast).parameters) == ["tensor", "dtype"]


def test_the_protocols_are_checked_at_run_time():
    hooks = tensorflow_telemetry.TelemetryHooks(np.full((2, 1, 4), -1.0, np.float32))
    assert isinstance(hooks, TelemetryHooks) and not isinstance(hooks, StepRecorder)
    assert not isinstance(object(), TelemetryHooks)
