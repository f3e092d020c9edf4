"""JAX side of cost calibration: compiled forward+backward steps, casts and device placement."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np


def versions() -> dict[str, str]:
    """Returns the framework versions that belong in a measurement's cache key."""
    return {"jax": jax.__version__}


def _is_array(value: Any) -> bool:
    return isinstance(value, jax.Array)


def _is_float(value: Any) -> bool:
    return _is_array(value) and jnp.issubdtype(value.dtype, jnp.floating)


def to_device(value: Any) -> Any:
    """Returns `value` with every NumPy array placed on the default device (once, not per step)."""
    return jax.tree_util.tree_map(
        lambda leaf: jax.device_put(leaf) if isinstance(leaf, np.ndarray) else leaf, value
    )


def random_tensor(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> jax.Array:
    """Returns standard-normal values in `dtype` on the default device, drawn from `rng`."""
    values = rng.standard_normal(shape, dtype=np.float32).astype(jnp.dtype(dtype))
    return jax.device_put(values)


def _symbolic(value: Any) -> Any:
    return keras.KerasTensor(value.shape, dtype=str(value.dtype)) if _is_array(value) else value


def _build(layer: keras.layers.Layer, args: list, kwargs: dict) -> list:
    """Builds `layer` for its arguments; returns `(shape, dtype)` of its float outputs."""
    symbolic_args, symbolic_kwargs = jax.tree_util.tree_map(_symbolic, (args, kwargs))
    try:
        outputs = layer(*symbolic_args, **symbolic_kwargs)
    except Exception:  # noqa: BLE001 - some layers only run eagerly
        outputs = layer(*args, **kwargs)
    flat = [
        tensor
        for tensor in jax.tree_util.tree_leaves(outputs)
        if hasattr(tensor, "dtype") and keras.backend.is_float_dtype(tensor.dtype)
    ]
    return [(tuple(int(dim) for dim in tensor.shape), str(tensor.dtype)) for tensor in flat]


def layer_step(
    layer: keras.layers.Layer, args: list, kwargs: dict, jit_compile: bool = True
) -> Callable[[], Any]:
    """Returns a function running one compiled forward+backward of a built-on-call `layer`."""
    del jit_compile
    output_specs = _build(layer, args, kwargs)
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    float_positions = [index for index, leaf in enumerate(leaves) if _is_float(leaf)]
    other_positions = [
        index for index, leaf in enumerate(leaves) if _is_array(leaf) and not _is_float(leaf)
    ]
    trainable_variables = list(layer.trainable_variables)
    state_variables = list(layer.non_trainable_variables)
    rng = np.random.default_rng(1)
    upstream = [random_tensor(shape, dtype, rng) for shape, dtype in output_specs]

    def forward(trainable, float_inputs, state, other_inputs):
        values = list(leaves)
        for index, value in zip(float_positions, float_inputs):
            values[index] = value
        for index, value in zip(other_positions, other_inputs):
            values[index] = value
        call_args, call_kwargs = jax.tree_util.tree_unflatten(treedef, values)
        mapping = list(zip(trainable_variables, trainable)) + list(zip(state_variables, state))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            results = layer(*call_args, **call_kwargs)
        updated = [scope.get_current_value(variable) for variable in state_variables]
        flat = [tensor for tensor in jax.tree_util.tree_leaves(results) if _is_float(tensor)]
        return flat, updated

    def step(trainable, float_inputs, state, other_inputs, cotangents):
        flat, pullback, updated = jax.vjp(
            lambda weights, inputs: forward(weights, inputs, state, other_inputs),
            trainable,
            float_inputs,
            has_aux=True,
        )
        return flat, pullback(cotangents), updated

    compiled = jax.jit(step)
    arguments = (
        [variable.value for variable in trainable_variables],
        [leaves[index] for index in float_positions],
        [variable.value for variable in state_variables],
        [leaves[index] for index in other_positions],
        upstream,
    )
    return lambda: jax.block_until_ready(compiled(*arguments))


def empty_step() -> Callable[[], Any]:
    """Returns a function running a compiled trivial op: the per-call dispatch overhead."""
    value = jnp.ones((1,), jnp.float32)
    compiled = jax.jit(lambda tensor: jnp.sum(tensor + 1.0))
    return lambda: jax.block_until_ready(compiled(value))


def cast_step(dtype: str, elements: int) -> Callable[[], Any]:
    """Returns a function casting `elements` float32 values to `dtype` and back (compiled)."""
    source = random_tensor((elements,), "float32", np.random.default_rng(0))
    target = jnp.dtype(dtype)

    def casts(tensor):
        there = tensor.astype(target)
        return there, there.astype(jnp.float32)

    compiled = jax.jit(casts)
    return lambda: jax.block_until_ready(compiled(source))
