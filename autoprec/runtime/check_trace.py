"""What the kernel check calls each layer with: one forward pass of the model, however it takes
inputs."""

from __future__ import annotations

import logging
from typing import Any

import keras
import numpy as np

from ..cost import LayerCall, ModelTrace, sample_inputs, trace_model
from ..errors import AutoprecError
from ..layers import layer_paths

logger = logging.getLogger("autoprec")

#: The length a model input's unknown dimension (a padded sequence length) takes in
#: the check.
PROBE_LENGTH = 8
#: Samples of the check's batch.
PROBE_BATCH = 2


def trace_for_check(model: keras.Model) -> ModelTrace | None:
    """Returns a forward pass of `model` whose calls the kernel check replays, or `None`."""
    try:
        return trace_model(model)
    except AutoprecError as error:
        reason = str(error)
    for way, attempt in (
        (f"at a length of {PROBE_LENGTH}", _at_probe_length),
        ("through its nested models", _through_nested_models),
        ("at the shapes it was built with", _at_built_shapes),
    ):
        try:
            trace = attempt(model)
        except Exception as error:  # the model refused the probe: the next way, or nothing
            reason += f"; {way} it raised {_first_line(error)}"
            continue
        if trace is not None:
            logger.debug("autoprec: kernel check of %r traced %s", model.name, way)
            return trace
    logger.info("autoprec: kernel check skipped: %s", reason)
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _at_probe_length(model: keras.Model) -> ModelTrace | None:
    """The model's own inputs, unknown lengths at `PROBE_LENGTH`; `None` without inputs."""
    try:
        sample = sample_inputs(model, PROBE_BATCH, unknown_length=PROBE_LENGTH)
    except AutoprecError:
        return None  # no symbolic inputs at all
    return trace_model(model, sample)


def _through_nested_models(model: keras.Model) -> ModelTrace | None:
    """Each nested model with inputs, traced alone, its calls under its path in `model`."""
    outer_path = {id(layer): path for path, layer in layer_paths(model).items()}
    calls: dict[str, tuple[LayerCall, ...]] = {}
    covered: list[str] = []
    for path, layer in layer_paths(model).items():
        if not isinstance(layer, keras.Model) or any(path.startswith(p + "/") for p in covered):
            continue
        trace = _nested_trace(layer)
        if trace is None:
            continue
        covered.append(path)
        for inner, inner_layer in layer_paths(layer).items():
            if inner in trace.calls and id(inner_layer) in outer_path:
                calls[outer_path[id(inner_layer)]] = trace.calls[inner]
    return ModelTrace(calls=calls, edges=()) if calls else None


def _nested_trace(model: keras.Model) -> ModelTrace | None:
    """A nested model's trace from its own inputs (unknown lengths probed), or `None`."""
    try:
        return trace_model(model)
    except AutoprecError:
        pass
    try:
        return _at_probe_length(model)
    except Exception:  # the nested model refused the probe length: left unchecked
        return None


def _at_built_shapes(model: keras.Model) -> ModelTrace | None:
    """The shapes `get_build_config` records, as floats, then as token ids; `None` without."""
    config = model.get_build_config() if model.built else None
    shapes = (config or {}).get("input_shape")
    if shapes is None:
        return None
    failure: Exception | None = None
    for make in (_normal_floats, _token_zeros):
        sample = keras.tree.map_shape_structure(make, shapes)
        try:
            return trace_model(model, sample)
        except Exception as error:  # floats refused: token ids next
            failure = error
    raise failure


def probe_inputs(model: keras.Model) -> Any:
    """Returns a small batch `model` runs on, made as the kernel check makes it, or `None`."""
    config = model.get_build_config() if model.built else None
    shapes = (config or {}).get("input_shape")
    makers = [lambda: sample_inputs(model, PROBE_BATCH, unknown_length=PROBE_LENGTH)]
    if shapes is not None:
        makers += [
            lambda make=make: keras.tree.map_shape_structure(make, shapes)
            for make in (_normal_floats, _token_zeros)
        ]
    for make_batch in makers:
        try:
            batch = make_batch()
            model(batch, training=False)
        except Exception:  # this probe is refused: the next one
            continue
        return batch
    return None


def _probe_shape(shape: Any) -> tuple[int, ...]:
    dims = tuple(shape)
    rest = tuple(PROBE_LENGTH if dim is None else int(dim) for dim in dims[1:])
    return (PROBE_BATCH, *rest) if dims else ()


def _normal_floats(shape: Any) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(_probe_shape(shape)).astype("float32")


def _token_zeros(shape: Any) -> np.ndarray:
    return np.zeros(_probe_shape(shape), "int32")
