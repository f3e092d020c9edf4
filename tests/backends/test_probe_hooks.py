"""Tests for autoprec._backends.probe_hooks: both profiler backends implement the one interface.

The JAX module is imported here only to read its signatures (its hooks run in
`test_jax_probes.py`, under the JAX Keras backend).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from autoprec._backends import probe_hooks, profiler_backend, tensorflow_tensorboard
from autoprec._backends import tensorflow as tf_backend

#: The module-level functions every profiler backend module provides beside `ProbeHooks`.
MODULE_FUNCTIONS = ("is_float_tensor", "xla_can_host_probes", "write_histograms")


def _members(cls) -> dict[str, list[str] | str]:
    """Public methods of `cls` with their parameter names; properties as `"property"`."""
    found: dict[str, list[str] | str] = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            found[name] = "property"
        elif callable(member):
            found[name] = list(inspect.signature(member).parameters)
    return found


def _backend_modules() -> list:
    return [tf_backend, pytest.importorskip("autoprec._backends.jax_probes")]


def test_both_backends_offer_the_protocols_members_with_its_signatures():
    protocol = _members(probe_hooks.ProbeHooks)
    assert set(protocol) == {
        "recording",
        "tensor_count",
        "install_step",
        "rebuild_train_function",
        "probe",
        "record",
        "read",
        "steps_recorded",
    }
    for module in _backend_modules():
        assert _members(module.ProbeHooks) == protocol, module.__name__
        assert list(inspect.signature(module.ProbeHooks).parameters) == ["xla"]


def test_both_backend_modules_offer_the_same_functions():
    tensorflow_module, jax_module = _backend_modules()
    for name in MODULE_FUNCTIONS:
        expected = inspect.signature(getattr(tensorflow_module, name)).parameters
        assert list(inspect.signature(getattr(jax_module, name)).parameters) == list(expected)
    assert list(inspect.signature(tensorflow_module.write_histograms).parameters) == [
        "logdir",
        "series",
        "step",
        "description",
    ]


def test_the_protocol_is_checked_at_run_time():
    hooks = profiler_backend().ProbeHooks(xla=False)
    assert isinstance(hooks, probe_hooks.ProbeHooks)
    assert not isinstance(object(), probe_hooks.ProbeHooks)
    assert hooks.tensor_count == 0 and hooks.steps_recorded() == 0 and hooks.read() == {}


def test_a_histogram_series_is_what_the_writers_take(tmp_path):
    series: probe_hooks.HistogramSeries = [("dense/output", np.array([-1, 2]), np.array([3, 4]))]
    profiler_backend().write_histograms(tmp_path, series, step=2)
    (buckets,) = tensorflow_tensorboard.read_histograms(tmp_path).values()
    assert buckets.tolist() == [[-1.0, 0.0, 3.0], [2.0, 3.0, 4.0]]
