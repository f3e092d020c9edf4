"""JAX side of cost calibration: compiled forward+backward steps, casts and device placement.

`autoprec.cost` decides *what* to time (which layer, on which shapes, in which
dtype) and how to take the median; this module builds the zero-argument
functions it times on the JAX backend. Each function runs one compiled
(`jax.jit`) computation on the default JAX device (a GPU when JAX has one) and
waits for it with `jax.block_until_ready`, so the time taken is device time,
not dispatch time.

**A layer's step** is the JAX counterpart of the TensorFlow one: the layer's
forward pass and a vector-Jacobian product with fixed random upstream
gradients (`jax.vjp`, as `tape.gradient(..., output_gradients=...)`), for its
trainable weights and its floating-point inputs. The weights, the other
(non-trainable) state and the inputs are arguments of the compiled function,
not constants baked into it. The layer is called through `__call__` inside a
`keras.StatelessScope` rather than through `layer.stateless_call`: only
`__call__` enters Keras' autocast scope, so that a `mixed_*` layer reads its
float32 kernels in its 16-bit compute dtype (`stateless_call` calls `call`
directly, and the matmul would silently promote to float32). Updated
non-trainable state (BatchNormalization's moving statistics, seed
generators) is returned, so XLA cannot drop the work that computes it.

JAX always compiles here: eager op-by-op JAX is not how a model trains.
"""

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
    """Returns standard-normal values in `dtype` on the default device, drawn from `rng`.

    Drawn and cast on the host (`ml_dtypes` for the 16-bit types), then copied
    once: a device-side draw would compile a random-number program for every
    new shape, which costs more than the draw itself.
    """
    values = rng.standard_normal(shape, dtype=np.float32).astype(jnp.dtype(dtype))
    return jax.device_put(values)


def _symbolic(value: Any) -> Any:
    return keras.KerasTensor(value.shape, dtype=str(value.dtype)) if _is_array(value) else value


def _build(layer: keras.layers.Layer, args: list, kwargs: dict) -> list:
    """Builds `layer` for its arguments; returns `(shape, dtype)` of its float outputs.

    A symbolic call (Keras tensors: shapes only) builds the layer without
    compiling its forward pass op by op; an eager call is the fallback.
    """
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
    """Returns a function running one compiled forward+backward of a built-on-call `layer`.

    Args:
        layer: a standalone layer (built here by one eager call if it is not).
        args: positional call arguments (JAX arrays or Python values).
        kwargs: keyword call arguments.
        jit_compile: ignored: on JAX the step is always compiled.

    Returns:
        A zero-argument function that runs the step and waits for its results.
    """
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
    """Returns a function casting `elements` float32 values to `dtype` and back (compiled).

    Both results are returned, so XLA materialises the 16-bit copy instead of
    fusing the two casts into one pass.
    """
    source = random_tensor((elements,), "float32", np.random.default_rng(0))
    target = jnp.dtype(dtype)

    def casts(tensor):
        there = tensor.astype(target)
        return there, there.astype(jnp.float32)

    compiled = jax.jit(casts)
    return lambda: jax.block_until_ready(compiled(source))
