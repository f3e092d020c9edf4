"""A subclassed model's own `call` under a plan: run once, and one dtype where it mixes two."""

from __future__ import annotations

from collections.abc import Mapping

import keras

from .._core.dtypes import FLOAT32, POLICY_FOR_DTYPE
from ..layers import is_graph_model, layer_paths
from .check_trace import probe_inputs
from .layer_check import (
    MIXED_ARITHMETIC,
    LayerCheck,
    alike_candidates,
    error_summary,
    mismatched_dtypes,
    planned_policies,
    run_once,
)


def needs_own_call_check(model: keras.Model, dtypes: Mapping[str, str]) -> bool:
    """Returns whether `model` has a `call` of its own in which two planned dtypes can meet."""
    if is_graph_model(model):
        return False
    top = {dtype for path, dtype in dtypes.items() if "/" not in path and dtype in POLICY_FOR_DTYPE}
    own = keras.backend.standardize_dtype(model.compute_dtype)
    return len(top | {own}) > 1


def check_own_call(model: keras.Model, dtypes: Mapping[str, str]) -> LayerCheck:
    """Returns whether `model`'s own `call` runs with its layers in `dtypes`, and what it runs in."""
    paths = layer_paths(model)
    with planned_policies(paths, dict.fromkeys(paths, FLOAT32)):  # a batch it runs on as it was
        batch = probe_inputs(model)
    if batch is None:
        return LayerCheck()
    error = _call_error(model, paths, dtypes, batch)
    if error is None or mismatched_dtypes(error) is None:
        return LayerCheck()
    planned = [dtype for dtype in dtypes.values() if dtype in POLICY_FOR_DTYPE]
    evidence = f"the model's own call mixes dtypes: {error_summary(error)}"
    for candidate in alike_candidates(planned):
        alike = dict.fromkeys(paths, candidate)
        if candidate == FLOAT32 or _call_error(model, paths, alike, batch) is None:
            return LayerCheck(MIXED_ARITHMETIC, evidence, candidate)
    return LayerCheck(MIXED_ARITHMETIC, evidence, FLOAT32)


def _call_error(
    model: keras.Model,
    paths: Mapping[str, keras.layers.Layer],
    dtypes: Mapping[str, str],
    batch: object,
) -> Exception | None:
    """What one training-mode call of the whole model raises in `dtypes` (state put back)."""
    state = [(variable, variable.numpy()) for variable in model.non_trainable_variables]
    with planned_policies(paths, dtypes):
        try:
            run_once(model, [batch], {"training": True})
        except Exception as error:  # the device's error type differs per backend
            return error
        finally:
            for variable, value in state:
                variable.assign(value)
    return None
