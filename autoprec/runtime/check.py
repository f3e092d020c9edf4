"""Calling layers in their planned dtypes: the forward pass the check replays, one layer (or a
subclassed model's own `call`) at a time, and what a failure says."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import keras
import numpy as np

from .._core.dtypes import (
    FLOAT32,
    POLICY_FOR_DTYPE,
    WIDENING_LADDER,
    is_float8_policy,
    wider_dtypes,
)
from .._core.models import call_model_code, error_line, error_lines
from ..cost import (
    LayerCall,
    ModelTrace,
    TensorSpec,
    random_inputs,
    sample_inputs,
    synthetic_arguments,
    trace_model,
)
from ..errors import AutoprecError, BackendError, PlanError
from ..layers import is_graph_model, layer_paths, layer_policy

logger = logging.getLogger("autoprec")

MISSING_KERNEL = "missing_kernel"
MIXED_ARITHMETIC = "mixed_arithmetic"
DTYPE_FAILURE = "dtype_failure"
CHECK_FAILED = "check_failed"

#: The length a model input's unknown dimension (a padded sequence length) takes in the check.
PROBE_LENGTH = 8
#: Samples of the check's batch.
PROBE_BATCH = 2

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
#: TensorFlow's C++ names of the float dtypes, as eager errors write them.
_TF_NAMES = {"float": "float32", "half": "float16", "double": "float64"}


@dataclasses.dataclass(frozen=True)
class MissingKernel:
    """A layer that cannot run in its planned dtype here (`kind`), or could not be checked
    ("check_failed": `fallback` is `dtype`); `error` is the line of the error that tells."""

    path: str
    dtype: str
    fallback: str
    error: str
    kind: str = MISSING_KERNEL


def error_summary(error: Exception) -> str:
    """Returns `"ErrorType: line"`, the line of a (possibly Keras-wrapped) error that tells most."""
    lines = error_lines(error)
    told = [line for line in lines if any(pattern.search(line) for pattern in _MISMATCH_PATTERNS)]
    told += [line for keyword in _KERNEL_KEYWORDS for line in lines if keyword in line.lower()]
    return f"{type(error).__name__}: {told[0]}"[:300] if told else error_line(error)


def mismatched_dtypes(error: Exception) -> tuple[str, str] | None:
    """Returns the two dtypes a dtype-mismatch error names, or `None` for another error."""
    if (
        not isinstance(error, (TypeError, ValueError))
        and "InvalidArgument" not in type(error).__name__
    ):
        return None
    for line in error_lines(error):
        for pattern in _MISMATCH_PATTERNS:
            match = pattern.search(line)
            if match:
                first, second = (_TF_NAMES.get(name, name) for name in match.groups())
                return first, second
    return None


def trace_for_check(model: keras.Model) -> ModelTrace | None:
    """Returns a forward pass of `model` whose calls the kernel check replays, or `None`."""
    lost = "its kernel check is skipped"
    return call_model_code(lambda: _traced(model), layer=model.name, lost=lost, fallback=None)


def _traced(model: keras.Model) -> ModelTrace | None:
    """The first way of tracing `model` that works; `None` when none does."""
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
            reason += f"; {way} it raised {error_line(error)}"
            continue
        if trace is not None:
            logger.debug("autoprec: kernel check of %r traced %s", model.name, way)
            return trace
    logger.info("autoprec: kernel check skipped: %s", reason)
    return None


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
    with contextlib.suppress(AutoprecError):
        return trace_model(model)
    try:
        return _at_probe_length(model)
    except Exception:  # the nested model refused the probe length: left unchecked
        return None


def _built_shape_samples(model: keras.Model) -> list:
    """Makers of a batch at the shapes `get_build_config` records: floats, then token ids."""
    config = model.get_build_config() if model.built else None
    shapes = (config or {}).get("input_shape")
    if shapes is None:
        return []

    def make(dtype: str) -> Any:
        specs = keras.tree.map_shape_structure(
            lambda shape: TensorSpec((None, *tuple(shape)[1:]) if len(shape) else (), dtype), shapes
        )
        return random_inputs(specs, PROBE_BATCH, unknown_length=PROBE_LENGTH)

    return [lambda dtype=dtype: make(dtype) for dtype in ("float32", "int32")]


def _at_built_shapes(model: keras.Model) -> ModelTrace | None:
    """The shapes `get_build_config` records, as floats, then as token ids; `None` without."""
    makers = _built_shape_samples(model)
    for make_batch in makers[:-1]:
        with contextlib.suppress(Exception):  # floats refused: token ids next
            return trace_model(model, make_batch())
    return trace_model(model, makers[-1]()) if makers else None


def probe_inputs(model: keras.Model) -> Any:
    """Returns a small batch `model` runs on, made as the kernel check makes it, or `None`."""
    makers = [lambda: sample_inputs(model, PROBE_BATCH, unknown_length=PROBE_LENGTH)]
    for make_batch in makers + _built_shape_samples(model):
        try:
            batch = make_batch()
            model(batch, training=False)
        except Exception:  # this probe is refused: the next one
            continue
        return batch
    return None


def subtree(paths: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Returns the entry at `path` and every entry under it, by path."""
    prefix = path + "/"
    return {key: value for key, value in paths.items() if key == path or key.startswith(prefix)}


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


def _run_error(
    layers: Mapping[str, keras.layers.Layer],
    dtypes: Mapping[str, str],
    target: keras.layers.Layer,
    args: list,
    kwargs: dict,
) -> Exception | None:
    """What one training-mode call of `target` raises with `layers` in `dtypes` (state put back)."""
    state = [(variable, variable.numpy()) for variable in target.non_trainable_variables]
    with planned_policies(layers, dtypes):
        try:
            run_once(target, args, kwargs)
        except Exception as error:  # the device's error type differs per backend
            return error
        finally:
            for variable, value in state:  # moving statistics and seeds as they were
                variable.assign(value)
    return None


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
    return _run_error(layers, dtypes, layers[path], args, kwargs)


def alike_candidates(planned: Iterable[str], container_dtype: str | None = None) -> list[str]:
    """Returns the dtypes to try, in order, for a layer and its sub-layers alike."""
    ladder = [name for name in set(planned) if name in WIDENING_LADDER]
    if len(ladder) > 1:
        widest = max(ladder, key=WIDENING_LADDER.index)
        return [widest, *wider_dtypes(widest)] if widest != FLOAT32 else [FLOAT32]
    if container_dtype in POLICY_FOR_DTYPE and container_dtype not in (*ladder, FLOAT32):
        return [container_dtype, FLOAT32]
    return [FLOAT32]


def _first_that_runs(candidates: Iterable[str], runs) -> str:
    """The first candidate dtype that is float32 or that `runs(dtype)`; float32 if none."""
    return next((dtype for dtype in candidates if dtype == FLOAT32 or runs(dtype)), FLOAT32)


def check_layer(
    paths: Mapping[str, keras.layers.Layer], path: str, call: LayerCall, current: Mapping[str, str]
) -> MissingKernel | None:
    """Returns why the layer at `path` and its sub-layers cannot run in `current`, and the fallback."""
    layers = subtree(paths, path)
    if any(is_float8_policy(layer_policy(inner)) for inner in layers.values()):
        return None  # Keras' float8 gradients run only compiled: the whole step shows them
    dtypes = {key: current[key] for key in layers if current.get(key) in POLICY_FOR_DTYPE}
    if path not in dtypes or all(dtype == FLOAT32 for dtype in dtypes.values()):
        return None
    container = path.rpartition("/")[0]
    container_dtype = current.get(container) if container else None
    dtype = dtypes[path]

    def runs(candidate: str) -> bool:
        return call_error(layers, path, call, dict.fromkeys(layers, candidate)) is None

    try:
        error = call_error(layers, path, call, dtypes)
        if error is None:
            return None
        wide = call_error(layers, path, call, dict.fromkeys(layers, FLOAT32))
    except BackendError as cannot:
        return MissingKernel(path, dtype, dtype, f"{cannot}", CHECK_FAILED)
    if wide is not None:
        return MissingKernel(path, dtype, dtype, error_summary(wide), CHECK_FAILED)
    named = mismatched_dtypes(error)
    if named is not None:
        made = next((name for name in named if name != dtype), FLOAT32)
        evidence = f"its own arithmetic mixes {made} tensors it makes with {dtype} ones: " + (
            error_summary(error)
        )
        fallback = _first_that_runs(alike_candidates(dtypes.values(), container_dtype), runs)
        return MissingKernel(path, dtype, fallback, evidence, MIXED_ARITHMETIC)
    text = " ".join(error_lines(error)).lower()  # the device says it has no kernel for a dtype
    kind = MISSING_KERNEL if any(word in text for word in _KERNEL_KEYWORDS) else DTYPE_FAILURE
    return MissingKernel(
        path, dtype, _first_that_runs(wider_dtypes(dtype), runs), error_summary(error), kind
    )


def dtype_clashes(model: keras.Model) -> list[str]:
    """Returns a line for each sub-layer computing in another dtype than its composite container."""
    paths = layer_paths(model)
    clashes = []
    for path, layer in paths.items():
        container_path = path.rsplit("/", 1)[0] if "/" in path else ""
        container = paths.get(container_path) if container_path else model
        if container is None or is_graph_model(container):
            continue
        layer_dtype, container_dtype = _compute_dtype(layer), _compute_dtype(container)
        if layer_dtype and container_dtype and layer_dtype != container_dtype:
            where = repr(container_path) if container_path else "the model's own call"
            clashes.append(
                f"{path!r} computes in {layer_dtype} inside {where}, "
                f"which computes in {container_dtype}"
            )
    return clashes


def _compute_dtype(layer: object) -> str | None:
    dtype = getattr(layer, "compute_dtype", None)
    return keras.backend.standardize_dtype(dtype) if dtype else None


def check_plan_runs(model: keras.Model, inputs: object) -> None:
    """Runs `model` once on the first sample of `inputs`; a failure names the layers that clash."""
    first = keras.tree.map_structure(lambda value: value[:1], inputs)
    try:
        model(first, training=False)
    except Exception as error:  # noqa: BLE001 - any failure of the call is reported
        clashes = dtype_clashes(model)
        if clashes:
            advice = (
                "Layers whose dtype differs from their container's: "
                + "; ".join(clashes[:8])
                + ". Give them their container's dtype (plan.with_dtype(path, dtype))."
            )
        else:
            advice = (
                "No sub-layer's dtype differs from its container's, so the failing layer's "
                "own arithmetic mixes dtypes: keep it in float32 "
                "(plan.with_dtype(path, 'float32'))."
            )
        raise PlanError(
            f"model {model.name!r} cannot run under this plan: calling it on one sample "
            f"raised {type(error).__name__}: {' '.join(error_lines(error)[:3])} {advice}"
        ) from error


def needs_own_call_check(model: keras.Model, dtypes: Mapping[str, str]) -> bool:
    """Returns whether `model` has a `call` of its own in which two planned dtypes can meet."""
    if is_graph_model(model):
        return False
    top = {dtype for path, dtype in dtypes.items() if "/" not in path and dtype in POLICY_FOR_DTYPE}
    own = keras.backend.standardize_dtype(model.compute_dtype)
    return len(top | {own}) > 1


def check_own_call(model: keras.Model, dtypes: Mapping[str, str]) -> MissingKernel | None:
    """Returns why `model`'s own `call` cannot run with its layers in `dtypes` (path `""`)."""
    paths = layer_paths(model)
    with planned_policies(paths, dict.fromkeys(paths, FLOAT32)):  # a batch it runs on as it was
        batch = probe_inputs(model)
    if batch is None:
        return None

    def error_in(planned: Mapping[str, str]) -> Exception | None:
        return _run_error(paths, planned, model, [batch], {"training": True})

    error = error_in(dtypes)
    if error is None or mismatched_dtypes(error) is None:
        return None
    planned = [dtype for dtype in dtypes.values() if dtype in POLICY_FOR_DTYPE]
    evidence = f"the model's own call mixes dtypes: {error_summary(error)}"
    fallback = _first_that_runs(
        alike_candidates(planned), lambda dtype: error_in(dict.fromkeys(paths, dtype)) is None
    )
    return MissingKernel("", "", fallback, evidence, MIXED_ARITHMETIC)
