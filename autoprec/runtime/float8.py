"""Float8 layers at run time: their scaling variables, and an optimizer that knows them."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import keras

from .._core.dtypes import is_float8_policy
from .._core.models import inner_optimizer, strategy_scope, sync_fit_state
from ..layers import FLOAT8_SCALING_VARIABLES, layer_paths, layer_policy
from ..numerics import FLOAT8_E4M3, FLOAT8_E5M2


def has_float8_path(layer: object) -> bool:
    """Returns whether Keras can train `layer` in float8 (a `Dense` or `EinsumDense`)."""
    return isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))


def float8_variables(layer: keras.layers.Layer) -> list[keras.Variable]:
    """Returns the float8 scaling variables a layer has (none before it was first quantized)."""
    found = (getattr(layer, name, None) for name in sorted(FLOAT8_SCALING_VARIABLES))
    return [variable for variable in found if isinstance(variable, keras.Variable)]


def sync_float8_variables(layers: Iterable[keras.layers.Layer]) -> None:
    """Makes each layer's float8 variables trainable exactly while it trains in float8."""
    keep_trainable = keras.backend.backend() == "jax"
    for layer in layers:
        active = keep_trainable or is_float8_policy(layer_policy(layer))
        for variable in float8_variables(layer):
            if variable.trainable != active:
                variable.trainable = active


def extend_optimizer(model: keras.Model) -> bool:
    """Rebuilds `model.optimizer` for trainable variables it was not built with, keeping its state."""
    optimizer = getattr(model, "optimizer", None)
    inner = inner_optimizer(optimizer)
    if optimizer is None or not getattr(inner, "built", False):
        return False
    known = {id(variable) for variable in getattr(inner, "_trainable_variables", [])}
    if all(id(variable) in known for variable in model.trainable_variables):
        return False
    sync_fit_state(model)  # JAX's fit holds the optimizer's state: write it back first
    with strategy_scope(model):
        replacement = type(optimizer).from_config(optimizer.get_config())
        replacement.build(model.trainable_variables)
    pairs = [(inner, inner_optimizer(replacement))]
    if replacement is not inner_optimizer(replacement):
        pairs.append((optimizer, replacement))
    for old, new in pairs:  # each one's own state, to the variable of the same name and shape
        targets = {variable.name: variable for variable in _own_variables(new)}
        for variable in _own_variables(old):
            target = targets.get(variable.name)
            if target is not None and tuple(target.shape) == tuple(variable.shape):
                # A copy, not the array itself: JAX donates the new optimizer's buffers to
                # its train step, which would delete the old optimizer's values with them.
                target.assign(keras.ops.convert_to_numpy(variable))
    model.optimizer = replacement
    return True


def _own_variables(optimizer: keras.optimizers.Optimizer) -> list[keras.Variable]:
    """The optimizer's variables less those of the optimizer it wraps, if any."""
    inner = inner_optimizer(optimizer)
    inner_ids = {id(variable) for variable in inner.variables} if inner is not optimizer else set()
    return [variable for variable in optimizer.variables if id(variable) not in inner_ids]


def keep_nested_float8_policies(model: keras.Model) -> int:
    """Records float8 sub-layer policies in their container's config, so `.keras` files reload them."""
    paths = layer_paths(model)
    containers = [path for path, layer in paths.items() if _builds_sub_layers(layer, path, paths)]
    outermost = [
        path for path in containers if not any(path.startswith(other + "/") for other in containers)
    ]
    kept = 0
    for container_path in outermost:
        container = paths[container_path]
        inside = [layer for path, layer in paths.items() if path.startswith(container_path + "/")]
        if not _holds_map(container):
            if not any(is_float8_policy(layer_policy(layer)) for layer in inside):
                continue
            own = container.dtype_policy
            container.dtype_policy = keras.dtype_policies.DTypePolicyMap(default_policy=own)
            if container.path:
                container.dtype_policy[container.path] = own
        policy_map = container.dtype_policy
        for layer in inside:
            # A sub-layer holding the map (one built from it) keeps its entry current itself.
            if layer.path and not _holds_map(layer):
                if layer.path in policy_map:
                    del policy_map[layer.path]
                policy_map[layer.path] = layer.dtype_policy
        kept += 1
    return kept


def _holds_map(layer: keras.layers.Layer) -> bool:
    return isinstance(layer.dtype_policy, keras.dtype_policies.DTypePolicyMap)


def _builds_sub_layers(layer: keras.layers.Layer, path: str, paths: dict) -> bool:
    """Whether a layer owns sub-layers that its own config does not describe (not a Model)."""
    if isinstance(layer, keras.Model):
        return False
    return any(other.startswith(path + "/") for other in paths)


def restore_variables(
    model: keras.Model, saved: Mapping[int, tuple[keras.Variable, object]]
) -> None:
    """Puts back saved variable values; float8 scaling variables made since start afresh."""
    for variable in model.variables:
        entry = saved.get(id(variable))
        if entry is not None:
            variable.assign(entry[1])
        elif variable.name in FLOAT8_SCALING_VARIABLES:
            _reset(variable)


#: The float8 format each of a layer's scaled tensors (Keras' variable prefix) is quantized to.
FLOAT8_TENSORS = (("inputs", FLOAT8_E4M3), ("kernel", FLOAT8_E4M3), ("outputs_grad", FLOAT8_E5M2))


#: How far an amax may exceed what its scale covers before it counts as saturating: the
#: top E4M3 step is 448 -> 416 (7 %), so clipping the largest values by less than a quarter
#: is within the rounding float8 adds anyway (a kernel's amax creeps up by a little each step).
SATURATION_RATIO = 1.25


def lagging_scales(layers: Mapping[str, keras.layers.Layer]) -> dict[str, str]:
    """Returns `{path: why}` of float8 layers whose scale misses the latest amax (worst tensor)."""
    found = {}
    for path, layer in layers.items():
        if not is_float8_policy(layer_policy(layer)) or not float8_variables(layer):
            continue
        worst_ratio = 0.0
        for tensor, fmt in FLOAT8_TENSORS:
            scale = float(keras.ops.convert_to_numpy(getattr(layer, f"{tensor}_scale")))
            history = getattr(layer, f"{tensor}_amax_history")
            amax = float(keras.ops.convert_to_numpy(history[0]))
            covered = fmt.max * scale  # Keras keeps the scale as amax / format max
            if amax > SATURATION_RATIO * covered and math.isfinite(amax):
                ratio = amax / covered if covered > 0 else float("inf")
                if ratio > worst_ratio:
                    worst_ratio = ratio
                    found[path] = (
                        f"{tensor} amax {amax:.3g} is {ratio:.2g}x what its delayed "
                        f"{fmt.name} scale covers ({covered:.3g}): the scale lags a "
                        "growing amax and values saturate"
                    )
    return found


def reset_float8_state(layer: keras.layers.Layer) -> None:
    """Restarts a layer's delayed scaling where a scale was lost (not positive), as a freshly
    quantized layer has it: scales 1, histories 0."""
    variables = float8_variables(layer)
    scales = [v for v in variables if v.name.endswith("_scale")]
    if not all(float(keras.ops.convert_to_numpy(v)) > 0 for v in scales):
        for variable in variables:
            _reset(variable)


def _reset(variable: keras.Variable) -> None:
    initial = 1.0 if variable.name.endswith("_scale") else 0.0
    variable.assign(keras.ops.full(variable.shape, initial, dtype=variable.dtype))


def float8_state(layers: Iterable[keras.layers.Layer]) -> list[tuple[keras.Variable, object]]:
    """Returns a host copy of the layers' float8 scaling variables, for `put_float8_state`."""
    return [
        (variable, keras.ops.convert_to_numpy(variable))
        for layer in layers
        for variable in float8_variables(layer)
    ]


def put_float8_state(saved: Iterable[tuple[keras.Variable, object]]) -> None:
    """Writes back what `float8_state` copied."""
    for variable, value in saved:
        variable.assign(value)


def weight_variables(model: keras.Model) -> list[keras.Variable]:
    """Returns the model's trainable variables without float8 scaling variables: its weights."""
    scaling = {
        id(variable)
        for layer in layer_paths(model).values()
        for variable in float8_variables(layer)
    }
    return [variable for variable in model.trainable_variables if id(variable) not in scaling]
