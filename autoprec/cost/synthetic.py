"""Random tensors shaped like a recorded layer call, to run a layer alone."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from .._backends import timing_backend
from ..errors import BackendError
from .trace import UNSUPPORTED_ARGUMENT, ArgumentValue, LayerCall, MappingArgument, TensorSpec


def synthetic_tensor(
    spec: TensorSpec,
    batch_size: int,
    dtype: str,
    rng: np.random.Generator,
    value_range: tuple[float, float] | None = None,
) -> Any:
    """Returns a backend tensor shaped like `spec` at `batch_size`, with random values.

    Float tensors hold standard-normal values (or uniform ones in `value_range`)
    in `dtype`; boolean tensors are all `True` and integer tensors all zero, in
    the dtype the layer saw (valid indices for an `Embedding`).

    Args:
        spec: a recorded tensor (`LayerCall.arguments` or `LayerCall.outputs`).
        batch_size: the leading dimension of the tensor.
        dtype: the dtype of a float tensor, e.g. the layer's compute dtype.
        rng: the random generator the values are drawn from.
        value_range: `(low, high)` of uniform values; `None` for standard-normal ones.

    Returns:
        A tensor of the active Keras backend (on TensorFlow and JAX, placed on the
        default device once).

    Example:

    ```python
    spec = autoprec.cost.TensorSpec((None, 8), "float32")
    tensor = autoprec.cost.synthetic_tensor(spec, 4, "bfloat16", np.random.default_rng(0))
    tensor.shape  # (4, 8)
    ```
    """
    shape = spec.concrete_shape(batch_size)
    if spec.dtype == "bool":
        return keras.ops.ones(shape, dtype="bool")
    if "float" not in spec.dtype:
        return keras.ops.zeros(shape, dtype=spec.dtype)
    if value_range is None:
        try:
            backend = timing_backend("synthetic_tensor()")
        except BackendError:
            backend = None
        if backend is not None:
            return backend.random_tensor(shape, dtype, rng)
        values = rng.standard_normal(shape).astype("float32")
    else:
        values = rng.uniform(value_range[0], value_range[1], size=shape).astype("float32")
    return keras.ops.cast(keras.ops.convert_to_tensor(values), dtype)


def synthetic_arguments(
    call: LayerCall,
    batch_size: int,
    dtype: str,
    rng: np.random.Generator,
    value_range: tuple[float, float] | None = None,
) -> tuple[list, dict]:
    """Returns `(args, kwargs)` that call a layer as `call` recorded, with random tensors.

    The first argument is passed by position, the others by name (`None` ones
    left out); each tensor argument becomes a `synthetic_tensor`, each list a
    list and each dict a dict of them (nested as recorded), and plain values
    are passed as recorded.

    Args:
        call: a recorded layer call, from `trace_model(model).calls[path]`.
        batch_size: the leading dimension of every tensor.
        dtype: the dtype of float tensors, e.g. the layer's compute dtype.
        rng: the random generator the values are drawn from.
        value_range: `(low, high)` of uniform float values; `None` for standard-normal ones.

    Returns:
        The positional arguments and the keyword arguments: `layer(*args, **kwargs)`.

    Raises:
        BackendError: naming the argument and the layer, when the trace could not
            describe an argument (neither tensors, nested in lists and dicts, nor a
            plain value).

    Example:

    ```python
    trace = autoprec.cost.trace_model(model)
    args, kwargs = autoprec.cost.synthetic_arguments(
        trace.calls["dense"][0], 4, "float32", np.random.default_rng(0)
    )
    layer(*args, **kwargs)
    ```
    """

    def build(value: ArgumentValue) -> Any:
        if isinstance(value, TensorSpec):
            return synthetic_tensor(value, batch_size, dtype, rng, value_range)
        if isinstance(value, tuple):
            return [build(item) for item in value]
        if isinstance(value, MappingArgument):
            return {key: build(item) for key, item in value.items}
        return value

    args: list = []
    kwargs: dict = {}
    for index, (name, value) in enumerate(call.arguments):
        if value == UNSUPPORTED_ARGUMENT:
            raise BackendError(f"argument {name!r} of {call.path} cannot be rebuilt")
        built = build(value)
        if index == 0:
            args.append(built)
        elif value is not None:
            kwargs[name] = built
    return args, kwargs
