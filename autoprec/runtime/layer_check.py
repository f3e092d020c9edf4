"""Call one layer alone, with its sub-layers in their planned dtypes, and say why it fails."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterable, Iterator, Mapping

import keras
import numpy as np

from .._core.dtypes import FLOAT32, POLICY_FOR_DTYPE, WIDENING_LADDER, wider_dtypes
from ..cost import LayerCall, synthetic_arguments
from ..errors import BackendError
from ..layers import layer_policy

MISSING_KERNEL = "missing_kernel"
MIXED_ARITHMETIC = "mixed_arithmetic"
DTYPE_FAILURE = "dtype_failure"
CHECK_FAILED = "check_failed"

_KERNEL_KEYWORDS = (
    "could not find device",
    "not in the list of allowed",
    "no registered",
    "not supported",
    "not implemented",
    "kernel",
)
_MISMATCH_PATTERNS = (
    re.compile(r"type (\w+) that does not match type (\w+)"),
    re.compile(r"expected to be a (\w+) tensor but is a (\w+) tensor"),
    re.compile(r"must have the same dtype.*?(\w+) vs\.? (\w+)"),
)


@dataclasses.dataclass(frozen=True)
class LayerCheck:
    """What calling one layer alone in its planned dtypes showed."""

    kind: str = ""
    error: str = ""
    fallback: str = FLOAT32


def subtree(paths: Mapping[str, keras.layers.Layer], path: str) -> dict[str, keras.layers.Layer]:
    """Returns the layer at `path` and every layer under it, by path."""
    prefix = path + "/"
    return {key: layer for key, layer in paths.items() if key == path or key.startswith(prefix)}


@contextlib.contextmanager
def planned_policies(
    layers: Mapping[str, keras.layers.Layer], dtypes: Mapping[str, str]
) -> Iterator[None]:
    """Sets each layer of `layers` named in `dtypes` to that dtype's policy, then puts them back."""
    originals = {}
    try:
        for path, layer in layers.items():
            if dtypes.get(path) in POLICY_FOR_DTYPE:
                originals[path] = layer_policy(layer)
                layer.dtype_policy = POLICY_FOR_DTYPE[dtypes[path]]
        yield
    finally:
        for path, policy in originals.items():
            layers[path].dtype_policy = policy


def run_once(layer: keras.layers.Layer, args: list, kwargs: dict) -> None:
    """Calls the layer forward, and backward where the backend allows it."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            outputs = layer(*args, **kwargs)
            floats = [
                tf.reduce_sum(tf.cast(tensor, "float32"))
                for tensor in tf.nest.flatten(outputs)
                if hasattr(tensor, "dtype") and tensor.dtype.is_floating
            ]
            total = tf.add_n(floats) if floats else None
        if total is not None and layer.trainable_weights:
            tape.gradient(total, layer.trainable_weights)
        return
    outputs = layer(*args, **kwargs)
    for tensor in keras.tree.flatten(outputs):
        keras.ops.convert_to_numpy(tensor)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _lines(error: Exception) -> list[str]:
    text = _ANSI.sub("", str(error))
    return [line.strip() for line in text.splitlines() if line.strip()]


#: TensorFlow's C++ names of the float dtypes, as eager errors write them.
_TF_NAMES = {"float": "float32", "half": "float16", "double": "float64"}


def _dtype_name(name: str) -> str:
    return _TF_NAMES.get(name, name)


def error_summary(error: Exception) -> str:
    """Returns `"ErrorType: line"`, the line of a (possibly Keras-wrapped) error that tells most."""
    lines = _lines(error)
    for line in lines:
        if any(pattern.search(line) for pattern in _MISMATCH_PATTERNS):
            return f"{type(error).__name__}: {line}"[:300]
    for keyword in _KERNEL_KEYWORDS:
        for line in lines:
            if keyword in line.lower():
                return f"{type(error).__name__}: {line}"[:300]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


def mismatched_dtypes(error: Exception) -> tuple[str, str] | None:
    """Returns the two dtypes a dtype-mismatch error names, or `None` for another error."""
    if (
        not isinstance(error, (TypeError, ValueError))
        and "InvalidArgument" not in type(error).__name__
    ):
        return None
    for line in _lines(error):
        for pattern in _MISMATCH_PATTERNS:
            match = pattern.search(line)
            if match:
                return _dtype_name(match.group(1)), _dtype_name(match.group(2))
    return None


def is_missing_kernel(error: Exception) -> bool:
    """Returns whether `error` is the device saying it has no kernel for an operation's dtype."""
    if mismatched_dtypes(error) is not None:
        return False
    text = " ".join(_lines(error)).lower()
    return any(keyword in text for keyword in _KERNEL_KEYWORDS)


def call_error(
    layers: Mapping[str, keras.layers.Layer],
    path: str,
    call: LayerCall,
    dtypes: Mapping[str, str],
) -> Exception | None:
    """Returns what calling the layer at `path` alone raises with `layers` in `dtypes`."""
    rng = np.random.default_rng(0)
    args, kwargs = synthetic_arguments(call, 2, dtypes[path], rng, value_range=(0.5, 1.5))
    kwargs["training"] = True  # as in a train step (Keras drops it where `call` takes none)
    state = [(variable, variable.numpy()) for variable in layers[path].non_trainable_variables]
    with planned_policies(layers, dtypes):
        try:
            run_once(layers[path], args, kwargs)
        except Exception as error:  # the device's error type differs per backend
            return error
        finally:
            for variable, value in state:  # moving statistics and seeds as they were
                variable.assign(value)
    return None


def _uniform(layers: Mapping[str, keras.layers.Layer], dtype: str) -> dict[str, str]:
    return {key: dtype for key in layers}


def _runs_in(layers, path: str, call: LayerCall, dtype: str) -> bool:
    return call_error(layers, path, call, _uniform(layers, dtype)) is None


def _mixed_arithmetic(error: Exception, dtype: str) -> str:
    """Returns the evidence of a mixed-dtype failure: which dtypes met, and the error's line."""
    named = mismatched_dtypes(error) or (FLOAT32, dtype)
    made = next((name for name in named if name != dtype), FLOAT32)
    return f"its own arithmetic mixes {made} tensors it makes with {dtype} ones: " + (
        error_summary(error)
    )


def alike_candidates(planned: Iterable[str], container_dtype: str | None = None) -> list[str]:
    """Returns the dtypes to try, in order, for a layer and its sub-layers alike."""
    ladder = [name for name in set(planned) if name in WIDENING_LADDER]
    if len(ladder) > 1:
        widest = max(ladder, key=WIDENING_LADDER.index)
        return [widest, *wider_dtypes(widest)] if widest != FLOAT32 else [FLOAT32]
    if container_dtype in POLICY_FOR_DTYPE and container_dtype not in (*ladder, FLOAT32):
        return [container_dtype, FLOAT32]
    return [FLOAT32]


def check_layer(
    layers: Mapping[str, keras.layers.Layer],
    path: str,
    call: LayerCall,
    dtypes: Mapping[str, str],
    container_dtype: str | None = None,
) -> LayerCheck:
    """Returns why the layer at `path` cannot run in its planned dtypes, and what it runs in."""
    dtype = dtypes[path]
    try:
        error = call_error(layers, path, call, dtypes)
        if error is None:
            return LayerCheck(fallback=dtype)
        wide = call_error(layers, path, call, _uniform(layers, FLOAT32))
    except BackendError as cannot:
        return LayerCheck(CHECK_FAILED, f"{cannot}", dtype)
    if wide is not None:
        return LayerCheck(CHECK_FAILED, error_summary(wide), dtype)
    if mismatched_dtypes(error) is not None:
        evidence = _mixed_arithmetic(error, dtype)
        for candidate in alike_candidates(dtypes.values(), container_dtype):
            if candidate == FLOAT32 or _runs_in(layers, path, call, candidate):
                return LayerCheck(MIXED_ARITHMETIC, evidence, candidate)
        return LayerCheck(MIXED_ARITHMETIC, evidence, FLOAT32)
    kind = MISSING_KERNEL if is_missing_kernel(error) else DTYPE_FAILURE
    for wider in wider_dtypes(dtype):
        if wider == FLOAT32 or _runs_in(layers, path, call, wider):
            return LayerCheck(kind, error_summary(error), wider)
    return LayerCheck(kind, error_summary(error), FLOAT32)
