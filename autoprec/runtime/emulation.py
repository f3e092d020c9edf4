"""Float16 numerics without float16 kernels: float32 math, float16 rounding at layer boundaries.

TensorFlow's CPU kernels for float16 are element-by-element fallbacks, some 100 to 300
times slower than float32 (a 2048-wide Dense train step: 19 s against 0.07 s), so a
search for a GPU cannot train its float16 plans natively on a CPU. `Float16Emulation`
gives those plans float16's numerics at float32's speed: an emulated layer computes in
float32, but its floating inputs and outputs are rounded to float16 (and back). Values
beyond 65504 become inf, small ones lose precision or flush to zero, and in the backward
pass the gradients crossing those boundaries are rounded the same way (the gradient of a
cast is a cast), so float16 overflow and underflow, and the loss scaling they need, show
as they would on a GPU. Inside the layer the math keeps float32 accumulation, as
float16 matrix units (tensor cores) do; weights are not rounded.
"""

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
    """Rounds a floating tensor to the nearest float16 value, keeping its dtype; other values pass.

    Args:
        value: anything; float32 and float64 tensors are rounded.

    Returns:
        `value` rounded through float16 (inf beyond 65504), or `value` unchanged.

    Example:

    ```python
    round_to_float16(keras.ops.convert_to_tensor([3001.0, 1e5]))  # [3000., inf]
    ```
    """
    dtype = getattr(value, "dtype", None)
    if dtype is None or not (keras.ops.is_tensor(value) or isinstance(value, keras.KerasTensor)):
        return value
    name = keras.backend.standardize_dtype(dtype)
    if name not in ("float32", "float64"):
        return value
    return keras.ops.cast(keras.ops.cast(value, FLOAT16), name)


def emulated_layers(dtypes: Mapping[str, str]) -> dict[str, str]:
    """Returns `{path: how}` of the layers to emulate for a plan's resolved dtypes.

    Float16 layers round both sides; float32 layers inside a float16 container round
    their inputs (they read what the container computed in float16).

    Args:
        dtypes: `{path: dtype}` of every layer, as `PrecisionPlan.resolve` gives it.

    Returns:
        `{path: BOTH_SIDES or INPUTS_ONLY}`.

    Example:

    ```python
    emulated_layers({"mha": "float16", "mha/softmax": "float32", "head": "float32"})
    # {"mha": "inputs and outputs", "mha/softmax": "inputs"}
    ```
    """
    chosen = {path: BOTH_SIDES for path, dtype in dtypes.items() if dtype == FLOAT16}
    for path, dtype in dtypes.items():
        if dtype != FLOAT32 or path in chosen:
            continue
        parents = path.split("/")[:-1]
        if any("/".join(parents[: depth + 1]) in chosen for depth in range(len(parents))):
            chosen[path] = INPUTS_ONLY
    return chosen


def without_float16(plan: PrecisionPlan, infos: Mapping[str, LayerInfo]) -> PrecisionPlan:
    """Returns `plan` with its float16 layers in float32: what runs while they are emulated.

    Args:
        plan: a plan for the model `infos` describes.
        infos: the model's layers, from `autoprec.layers.describe_model`.

    Returns:
        A `PrecisionPlan` deciding every layer: float16 ones as float32, others as in `plan`.

    Example:

    ```python
    infos = autoprec.layers.describe_model(model)
    autoprec.apply_plan(model, without_float16(plan, infos))
    emulation.set_layers(emulated_layers(plan.resolve(infos)))
    ```
    """
    own = {
        path: FLOAT32 if dtype == FLOAT16 else dtype
        for path, dtype in plan.resolve(infos).items()
        if infos[path].follows is None or path in plan.layers
    }
    return PrecisionPlan(
        own, layer_info=infos, fingerprint=plan.fingerprint, model_name=plan.model_name
    )


class Float16Emulation:
    """Wraps a model's layers once so that any of them can be emulated in float16 from one trace on.

    Install it before anything else wraps the layers' `call` (probes, guard telemetry):
    its wrappers stay in place and only read which layers are emulated when a function
    is traced, so other wrappers can come and go on top of them. Changing the emulated
    layers takes effect at the next trace (`reset_compiled_functions`, a recompile).

    Args:
        model: the model whose layers may be emulated (usually a private clone).

    Example:

    ```python
    emulation = Float16Emulation(model)
    emulation.install()
    emulation.set_layers(emulated_layers(plan.resolve()))
    model.compile(...)  # traces with the emulated layers
    model.fit(x, y)
    emulation.remove()
    ```
    """

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        self.active: dict[str, str] = {}
        self._undo: list[Callable[[], None]] = []

    @property
    def installed(self) -> bool:
        """Whether the wrappers are in place."""
        return bool(self._undo)

    def install(self) -> None:
        """Wraps every layer's `call` (pass-through until `set_layers` names it)."""
        if self.installed:
            return
        for path, layer in layer_paths(self.model).items():
            self._undo.append(swap_attribute(layer, "call", self._wrap(path, layer.call)))

    def set_layers(self, layers: Mapping[str, str] | Iterable[str]) -> None:
        """Sets the layers emulated from the next trace on.

        Args:
            layers: `{path: BOTH_SIDES or INPUTS_ONLY}` (see `emulated_layers`), or paths
                (both sides); empty for none.
        """
        if isinstance(layers, Mapping):
            self.active = dict(layers)
        else:
            self.active = {path: BOTH_SIDES for path in layers}

    def remove(self) -> None:
        """Puts back every layer's own `call`."""
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        self.active = {}

    def _wrap(self, path: str, original: Callable) -> Callable:
        emulation = self

        @functools.wraps(original)
        def call(*args, **kwargs):
            how = emulation.active.get(path)
            if how is None:
                return original(*args, **kwargs)
            args = keras.tree.map_structure(round_to_float16, args)
            kwargs = {
                name: keras.tree.map_structure(round_to_float16, value)
                for name, value in kwargs.items()
            }
            outputs = original(*args, **kwargs)
            if how == INPUTS_ONLY:
                return outputs
            return keras.tree.map_structure(round_to_float16, outputs)

        return call
