"""Float16 numerics without float16 kernels: float32 math, float16 rounding at layer boundaries."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping

import keras

from .._core.dtypes import FLOAT16, FLOAT32
from .._core.models import swap_attribute
from ..layers import LayerInfo, layer_paths
from ..plan import PrecisionPlan

#: How an emulated layer rounds: both sides, or its inputs only (a float32 layer inside a
#: float16 container, such as the softmax of a float16 attention layer: it reads float16
#: values, and its float32 output goes on in float32).
BOTH_SIDES = "inputs and outputs"
INPUTS_ONLY = "inputs"


def round_to_float16(value: object) -> object:
    """Rounds a floating tensor to the nearest float16 value, keeping its dtype; other values pass."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or not (keras.ops.is_tensor(value) or isinstance(value, keras.KerasTensor)):
        return value
    name = keras.backend.standardize_dtype(dtype)
    if name not in ("float32", "float64"):
        return value
    return keras.ops.cast(keras.ops.cast(value, FLOAT16), name)


def emulated_layers(dtypes: Mapping[str, str]) -> dict[str, str]:
    """Returns `{path: how}` of the layers to emulate for a plan's resolved dtypes."""
    chosen = {path: BOTH_SIDES for path, dtype in dtypes.items() if dtype == FLOAT16}
    for path, dtype in dtypes.items():
        if dtype != FLOAT32 or path in chosen:
            continue
        parents = path.split("/")[:-1]
        if any("/".join(parents[: depth + 1]) in chosen for depth in range(len(parents))):
            chosen[path] = INPUTS_ONLY
    return chosen


def without_float16(plan: PrecisionPlan, infos: Mapping[str, LayerInfo]) -> PrecisionPlan:
    """Returns `plan` with its float16 layers in float32: what runs while they are emulated."""
    own = {
        path: FLOAT32 if dtype == FLOAT16 else dtype
        for path, dtype in plan.resolve(infos).items()
        if infos[path].follows is None or path in plan.layers
    }
    return PrecisionPlan(
        own, layer_info=infos, fingerprint=plan.fingerprint, model_name=plan.model_name
    )


class Float16Emulation:
    """Wraps a model's layers once so that any of them can be emulated in float16 from one trace on."""

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        self.active: dict[str, str] = {}
        self._undo: list[Callable[[], None]] = []

    def install(self) -> None:
        """Wraps every layer's `call` (pass-through until `set_layers` names it), once."""
        if self._undo:
            return
        for path, layer in layer_paths(self.model).items():
            self._undo.append(swap_attribute(layer, "call", self._wrap(path, layer.call)))

    def set_layers(self, layers: Mapping[str, str] | Iterable[str]) -> None:
        """Sets the layers emulated from the next trace on."""
        mapping = isinstance(layers, Mapping)
        self.active = dict(layers) if mapping else dict.fromkeys(layers, BOTH_SIDES)

    def remove(self) -> None:
        """Puts back every layer's own `call`."""
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        self.active = {}

    def _wrap(self, path: str, original: Callable) -> Callable:
        @functools.wraps(original)
        def call(*args, **kwargs):
            how = self.active.get(path)
            if how is None:
                return original(*args, **kwargs)
            args, kwargs = keras.tree.map_structure(round_to_float16, (args, kwargs))
            outputs = original(*args, **kwargs)
            if how == INPUTS_ONLY:
                return outputs
            return keras.tree.map_structure(round_to_float16, outputs)

        return call
