"""Tests for autoprec.profiler.tensor_stats: the statistics of several tensors together."""

from __future__ import annotations

import numpy as np
from profiler.reference import assert_matches_reference

from autoprec.profiler import LayerProfile, TensorStats
from autoprec.profiler.tensor_stats import merge_groups

_PARTS = {
    "normal": np.random.default_rng(2).normal(scale=4.0, size=(6, 5)).astype(np.float32),
    "special": np.array([0.0, np.inf, -np.nan, 1e-41, 7e4, -3.0], np.float32),
    "zeros": np.zeros(7, np.float32),
    "tiny": np.array([2.0**-30, -(2.0**-20), 0.0], np.float32),
}


def test_merged_statistics_are_those_of_the_concatenated_tensors():
    merged = TensorStats.merge([TensorStats.from_values(v) for v in _PARTS.values()])
    everything = np.concatenate([values.ravel() for values in _PARTS.values()])
    assert isinstance(merged, TensorStats)
    assert_matches_reference(merged, everything)
    assert merged.nan == 1 and merged.nonfinite == 2
    # The merged histogram is read-only, as every TensorStats histogram is.
    assert not merged.histogram.flags.writeable


def test_nothing_to_merge_is_none_and_none_items_are_skipped():
    assert TensorStats.merge([]) is None
    assert TensorStats.merge([None, None]) is None
    only = TensorStats.from_values(_PARTS["tiny"])
    alone = TensorStats.merge([None, only, None])
    assert alone.to_dict() == only.to_dict()
    # A tensor without non-zero values leaves the smallest magnitude to the others.
    zeros = TensorStats.from_values(_PARTS["zeros"])
    assert TensorStats.merge([zeros]).min_nonzero_abs is None
    assert TensorStats.merge([zeros, only]).min_nonzero_abs == 2.0**-30


def test_merge_takes_any_iterable():
    parts = [TensorStats.from_values(values) for values in _PARTS.values()]
    assert TensorStats.merge(iter(parts)).to_dict() == TensorStats.merge(parts).to_dict()


def test_groups_merge_across_kinds_as_the_layer_views_do():
    stats = {name: TensorStats.from_values(values) for name, values in _PARTS.items()}
    layer = LayerProfile(
        path="dense",
        class_name="Dense",
        dtype="float32",
        activations={"output/0": stats["normal"], "output/1": stats["special"]},
        activation_gradients={"output/0": stats["tiny"]},
        weights={"kernel": stats["zeros"]},
        weight_gradients={"kernel": stats["normal"]},
        internals={"attention_logits": stats["tiny"]},
    )
    forward = merge_groups(TensorStats, layer.activations, layer.internals)
    assert forward.to_dict() == layer.forward.to_dict()
    assert_matches_reference(
        forward, np.concatenate([_PARTS[name].ravel() for name in ("normal", "special", "tiny")])
    )
    gradient = merge_groups(TensorStats, layer.activation_gradients, layer.weight_gradients)
    assert gradient.to_dict() == layer.gradient.to_dict()
    assert merge_groups(TensorStats, {}, {}) is None
    assert merge_groups(TensorStats) is None
