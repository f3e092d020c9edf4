"""Detect layers whose planned 16-bit dtype has no kernel on this device, before training.

Some operations have no float16 or bfloat16 kernel on some devices (on
TensorFlow's CPU, `tf.linalg.det` has neither; `tf.math.lgamma` has float16 but
not bfloat16). A plan that puts such a layer in 16-bit would fail at the first
train step with an error far from its cause. `find_missing_kernels` calls each
16-bit layer once, alone, forward and backward, on a tiny batch shaped like what
it sees in the model; `fallback_plan` moves every failing layer to the next
wider dtype (float16 -> bfloat16 -> float32) and records why in the plan.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Mapping, Sequence

import keras
import numpy as np

from .._core.dtypes import FLOAT8, FLOAT32, POLICY_FOR_DTYPE, is_float8_policy, wider_dtypes
from ..cost import LayerCall, ModelTrace, synthetic_arguments, trace_model
from ..errors import AutoprecError, BackendError
from ..layers import describe_model, layer_paths, layer_policy
from ..plan import PrecisionPlan

logger = logging.getLogger("autoprec")

#: `{model: {(path, dtype): MissingKernel or None}}`: the 16-bit kernels checked on each model.
_CHECKED_KERNELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class MissingKernel:
    """A layer that cannot run in its planned dtype here.

    Attributes:
        path: the layer's stable path.
        dtype: the planned dtype that failed.
        fallback: the dtype the layer falls back to.
        error: the first line of the error the device raised.
    """

    path: str
    dtype: str
    fallback: str
    error: str


def _run_once(layer: keras.layers.Layer, args: list, kwargs: dict) -> None:
    """Calls the layer forward, and backward where the backend allows it."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            outputs = layer(*args, **kwargs)
            floats = [
                tf.reduce_sum(tf.cast(tensor, "float32"))
                for tensor in tf.nest.flatten(outputs)
                if tensor.dtype.is_floating
            ]
            total = tf.add_n(floats) if floats else None
        if total is not None and layer.trainable_weights:
            tape.gradient(total, layer.trainable_weights)
        return
    outputs = layer(*args, **kwargs)
    for tensor in keras.tree.flatten(outputs):
        keras.ops.convert_to_numpy(tensor)


def _error_summary(error: Exception) -> str:
    """Returns the line of a (possibly Keras-wrapped) error that names the missing kernel."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    keywords = (
        "could not find device",
        "not in the list of allowed",
        "no registered",
        "not supported",
        "not implemented",
        "kernel",
    )
    for keyword in keywords:
        for line in lines:
            if keyword in line.lower():
                return f"{type(error).__name__}: {line}"[:300]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


def _fails(layer: keras.layers.Layer, call: LayerCall, dtype: str) -> str | None:
    """Returns the error of running `layer` in `dtype`, or `None` if it runs."""
    if any(is_float8_policy(layer_policy(inner)) for inner in layer_paths(layer).values()):
        return None  # Keras' float8 gradients run only compiled: the whole step shows them
    rng = np.random.default_rng(0)
    try:
        arguments = synthetic_arguments(call, 2, dtype, rng, value_range=(0.5, 1.5))
    except BackendError:  # an argument that cannot be rebuilt: nothing to check
        return None
    original = layer_policy(layer)
    layer.dtype_policy = POLICY_FOR_DTYPE[dtype]
    try:
        _run_once(layer, *arguments)
    except Exception as error:  # the device's error type differs per backend
        return _error_summary(error)
    finally:
        layer.dtype_policy = original
    return None


def find_missing_kernels(
    model: keras.Model, dtypes: Mapping[str, str], trace: ModelTrace | None = None
) -> list[MissingKernel]:
    """Returns the layers that cannot run forward and backward in their planned dtype here.

    Args:
        model: a built model, with the policies it had before the plan (the
            trace runs the whole model once).
        dtypes: `{path: dtype}` the plan gives each layer.
        trace: an `autoprec.cost.ModelTrace` of the model; traced here if omitted.

    Returns:
        One `MissingKernel` per failing layer, with the dtype it falls back to
        (float16 -> bfloat16 -> float32, each tried in turn).

    Example:

    ```python
    missing = autoprec.runtime.kernels.find_missing_kernels(model, plan.resolve(describe_model(model)))
    ```
    """
    if all(dtype == FLOAT32 for dtype in dtypes.values()):
        return []
    if trace is None:
        try:
            trace = trace_model(model)
        except AutoprecError as error:
            logger.info("autoprec: kernel check skipped: %s", error)
            return []
    infos = describe_model(model)
    paths = layer_paths(model)
    missing = []
    for path, dtype in dtypes.items():
        info = infos.get(path)
        calls = trace.calls.get(path, ())
        if dtype == FLOAT32 or info is None or info.pass_through or not calls:
            continue
        if info.is_container and info.follows is not None:
            continue  # a nested model: its layers are checked one by one
        error = _fails(paths[path], calls[0], dtype)
        if error is None:
            continue
        missing.append(MissingKernel(path, dtype, _fallback(paths[path], calls[0], dtype), error))
    return missing


def unchecked_kernels(model: keras.Model, dtypes: Mapping[str, str]) -> dict[str, str]:
    """Returns the 16-bit `{path: dtype}` of `dtypes` whose kernel was not checked on this model yet.

    Args:
        model: the model.
        dtypes: `{path: dtype}` a plan gives each layer.

    Returns:
        The pairs `missing_kernels_once` would check now (empty: it answers from memory).

    Example:

    ```python
    if unchecked_kernels(model, handle.dtypes):
        handle.restore()  # the check runs with the model as it was
    ```
    """
    checked = _CHECKED_KERNELS.get(model, {})
    return {
        path: dtype
        for path, dtype in dtypes.items()
        if dtype not in (FLOAT32, FLOAT8) and (path, dtype) not in checked
    }


def missing_kernels_once(model: keras.Model, dtypes: Mapping[str, str]) -> list[MissingKernel]:
    """Returns `find_missing_kernels` for `dtypes`, checking each (layer, dtype) of a model once.

    Pairs already checked on this model are answered from memory; the others are
    checked now, with the model in the policies it has (those before any plan).

    Args:
        model: a built model, with the policies it had before the plan.
        dtypes: `{path: dtype}` the plan gives each layer.

    Returns:
        One `MissingKernel` per layer of `dtypes` whose dtype has no kernel here.

    Example:

    ```python
    missing = missing_kernels_once(model, handle.dtypes)
    ```
    """
    checked = _CHECKED_KERNELS.setdefault(model, {})
    unchecked = unchecked_kernels(model, dtypes)
    if unchecked:
        found = {(item.path, item.dtype): item for item in find_missing_kernels(model, unchecked)}
        for path, dtype in unchecked.items():
            checked[(path, dtype)] = found.get((path, dtype))
    return [
        checked[(path, dtype)]
        for path, dtype in dtypes.items()
        if checked.get((path, dtype)) is not None
    ]


def _fallback(layer: keras.layers.Layer, call: LayerCall, dtype: str) -> str:
    """Returns the nearest wider dtype the layer runs in; float32 ends the ladder."""
    for wider in wider_dtypes(dtype):
        if wider == FLOAT32 or not _fails(layer, call, wider):
            return wider
    return FLOAT32


def fallback_plan(
    plan: PrecisionPlan, missing: Sequence[MissingKernel], step: int = 0
) -> PrecisionPlan:
    """Returns `plan` with each missing-kernel layer moved to its fallback dtype, logged as events.

    Args:
        plan: the plan to change.
        missing: what `find_missing_kernels` returned.
        step: the train step recorded in each event.

    Returns:
        A new plan; each change is a `"missing_kernel"` event in `plan.events`.

    Example:

    ```python
    plan = autoprec.runtime.kernels.fallback_plan(plan, missing)
    ```
    """
    for item in missing:
        event = {
            "step": step,
            "kind": "missing_kernel",
            "layer": item.path,
            "from": item.dtype,
            "to": item.fallback,
            "evidence": item.error,
        }
        plan = plan.with_dtype(item.path, item.fallback).with_event(event)
        logger.warning(
            "autoprec: %s has no %s kernel here (%s); it runs in %s",
            item.path,
            item.dtype,
            item.error,
            item.fallback,
        )
    return plan
