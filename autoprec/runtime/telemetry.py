"""Per-layer amax telemetry inside the compiled train step: what the guard reads when a step fails.

While the guard is on, every 16-bit layer's `call` is wrapped (on the
instance, as the profiler does) so that, inside the model's own compiled
train step, it records four maxima of `|x|`:

- `output`: the layer's float outputs;
- `input`: the float inputs it received (already cast to its compute dtype);
- `internal`: intermediates that can overflow inside the layer: the attention
  logits of `MultiHeadAttention` (recomputed in float32, forward only);
- `gradient`: its weight gradients (seen by the optimizer) and, for a
  float16 layer, the gradients flowing back into its outputs (a
  custom-gradient identity), both under the step's loss scale.

A non-finite value shows as an infinite or NaN maximum. The step also records
the largest magnitude of its input batch, its loss scale and whether any
gradient (of any layer) was non-finite. Each step's values are appended to a
short history kept on the device (the last `history_steps` steps, as
Transformer Engine keeps an amax history for FP8). The host reads one small
status tensor per step (did a step fail, did a float16 layer set a new amax
record within `near_binades` binades of 65504) and the history only when the
status says so. No histograms: one reduction per recorded tensor.

What it costs is kept to about one pass over each 16-bit layer's outputs:

- A maximum of `|x|` is an integer maximum of the bit pattern with the sign
  bit masked (16-bit tensors reduced as 16-bit integers, no float32 copy).
  Non-negative floats order as their bit patterns do, and inf and NaN have the
  all-ones exponent, so the result is the amax and the finiteness flag at once
  (NaN above inf), under XLA too, whose float maximum drops NaN.
- A tensor is measured once per traced step: a layer's input that another
  recorded layer produced is not measured again, nor is the output of a
  pass-through layer that cannot enlarge magnitudes (ReLU, max pooling,
  reshapes, concatenation: its bound is the largest of its inputs', which the
  pass-through layer's readers record as their input). Such a layer is never
  attributed: its outputs leave the range only if its inputs did.
- Activation gradients are recorded for float16 layers, whose gradients run
  under a loss scale and can overflow; a bfloat16 layer has float32's range,
  and its non-finite gradients show in its weight gradients and in the
  gradients' finiteness flag. Attention logits are recomputed in float32 only
  for float16 layers (a bfloat16 layer's logits cannot leave the range without
  making its outputs non-finite).
- The step's scalars are combined in one segment maximum and written to the
  history with one update.

The values are computed with `keras.ops`. On TensorFlow the history, count
and status are variables (one copy per replica under a `tf.distribute`
strategy) updated inside the step. On JAX the train step is a pure function:
the forward values leave the differentiated loss function as one extra
auxiliary output, the activation-gradient maxima (a gradient function is
traced on its own) and the step's frame reach the host through ordered host
callbacks, and the history is kept on the host; reading it waits for the
callbacks. On any other backend `GuardTelemetry` raises `BackendError`.

Outside XLA on a TensorFlow GPU (which has no 16-bit integer maximum kernel)
the amax is `max(abs(x))` in the tensor's dtype instead.

Example:

```python
telemetry = GuardTelemetry(model, {"dense": "float16", "head": "float32"})
telemetry.install()
model.make_train_function(force=True)
model.fit(x, y, epochs=1)
if telemetry.read_status().failed:
    print(telemetry.read_records()[-1])
```
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np
from keras import ops

from .._backends import telemetry_backend
from .._core.dtypes import FLOAT16, FLOAT32
from .._core.models import swap_attribute
from ..layers import (
    PASS_THROUGH_CLASSES,
    is_graph_model,
    is_pass_through,
    layer_paths,
    observing_attention,
)

#: What is recorded for every 16-bit layer, in this order.
SLOTS = ("output", "input", "internal", "gradient")
OUTPUT, INPUT, INTERNAL, GRADIENT = range(len(SLOTS))
#: The value of a slot nothing was recorded in.
NOT_RECORDED = -1.0
# Float32 bit patterns: the amax of a tensor is carried as the int32 bits of a
# non-negative float32 (integer order is float order; inf and NaN at the top).
_NOT_RECORDED_BITS = int(np.array(NOT_RECORDED, np.float32).view(np.int32))
_MAGNITUDE_BITS = {"float16": 0x7FFF, "bfloat16": 0x7FFF, "float32": 0x7FFFFFFF}
_INFINITY_BITS = 0x7F800000  # float32 inf; NaN patterns lie above it
_BITS_DTYPE = {"float16": "int16", "bfloat16": "int16", "float32": "int32"}
#: Pass-through layers whose outputs are never larger in magnitude than their
#: inputs (the dropout and noise layers scale or add, and are left out).
BOUNDED_PASS_THROUGH = frozenset(
    name
    for name in PASS_THROUGH_CLASSES
    if "Dropout" not in name and name not in ("GaussianNoise", "InputLayer")
)
#: The largest finite value of each compute dtype.
FORMAT_MAX = {
    FLOAT16: 65504.0,
    "bfloat16": 3.3895313892515355e38,
    FLOAT32: 3.4028234663852886e38,
}

# Attributes Keras hangs on tensors that an observed output must carry on.
_KERAS_TENSOR_ATTRIBUTES = ("_keras_mask", "_keras_logits")
_ACTIVE = threading.local()  # the step being traced, per replica thread
# The telemetry installed on each model (by id), so that installing another removes it.
_INSTALLED: weakref.WeakValueDictionary[int, GuardTelemetry] = weakref.WeakValueDictionary()


def format_max(dtype: str) -> float:
    """Returns the largest finite value of a compute dtype (float32's for unknown names).

    Args:
        dtype: `"float16"`, `"bfloat16"` or `"float32"`.

    Returns:
        65504.0 for float16, about 3.39e38 for bfloat16, 3.40e38 for float32.

    Example:

    ```python
    format_max("float16")  # 65504.0
    ```
    """
    return FORMAT_MAX.get(dtype, FORMAT_MAX[FLOAT32])


def is_out_of_range(value: float, dtype: str) -> bool:
    """Returns whether a recorded amax is non-finite or above `dtype`'s largest value.

    Args:
        value: a recorded maximum magnitude (`NOT_RECORDED` counts as in range).
        dtype: the compute dtype the value had to fit.

    Returns:
        `True` when the value left the format's range.

    Example:

    ```python
    is_out_of_range(float("inf"), "bfloat16")  # True
    ```
    """
    if value == NOT_RECORDED:
        return False
    return not math.isfinite(value) or value > format_max(dtype)


@dataclasses.dataclass(frozen=True)
class LayerAmax:
    """The maxima of `|x|` one layer recorded in one step (`NOT_RECORDED` where nothing was).

    Attributes:
        output: of its float outputs.
        input: of its float inputs, in its compute dtype.
        internal: of intermediates that can overflow inside it (attention logits).
        gradient: of the gradients of its outputs and weights, under the loss scale.
    """

    output: float = NOT_RECORDED
    input: float = NOT_RECORDED
    internal: float = NOT_RECORDED
    gradient: float = NOT_RECORDED

    @property
    def forward(self) -> float:
        """The largest of `output` and `internal` (NaN when either is NaN)."""
        values = (self.output, self.internal)
        if any(math.isnan(value) for value in values):
            return math.nan
        return max(values)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """What the telemetry recorded for one train step.

    Attributes:
        index: the step's number among the steps recorded since installing (1-based).
        loss_scale: the loss scale the step ran with (1.0 without scaling).
        batch_amax: the largest magnitude in the step's input batch (NaN or inf
            when the batch held non-finite values).
        gradients_finite: whether every gradient the optimizer received was finite.
        layers: `{path: LayerAmax}` for every recorded 16-bit layer, in model order.
    """

    index: int
    loss_scale: float
    batch_amax: float
    gradients_finite: bool
    layers: Mapping[str, LayerAmax]

    @property
    def batch_finite(self) -> bool:
        """Whether the input batch held only finite values."""
        return math.isfinite(self.batch_amax)

    @property
    def finite(self) -> bool:
        """Whether nothing in the step was non-finite (batch, layers and gradients)."""
        if not (self.batch_finite and self.gradients_finite):
            return False
        return all(
            value == NOT_RECORDED or math.isfinite(value)
            for amax in self.layers.values()
            for value in dataclasses.astuple(amax)
        )


@dataclasses.dataclass(frozen=True)
class TelemetryStatus:
    """The one small tensor the host reads after each step.

    Attributes:
        failed: a step since the last `clear_status` had non-finite values.
        near_range: a float16 layer set a new amax record within the warning
            distance of 65504.
    """

    failed: bool = False
    near_range: bool = False

    def __bool__(self) -> bool:
        return self.failed or self.near_range


class _StepTrace:
    """Tensors recorded while one train step is traced (in one replica's thread).

    Every value is an int32 scalar: the float32 bit pattern of an amax.
    """

    def __init__(self, integer: bool, owner: object = None) -> None:
        self.integer = integer
        self.owner = owner
        self.values: dict[tuple[int, int], list] = {}
        self.all_gradients: list = []
        self.packed_segments: list[int] = []
        # Slots of bfloat16 layers, measured only in a step whose gradients or batch
        # are non-finite: (segment, parts), each part a tensor or amax bits.
        self.lazy: list[tuple[int, list]] = []
        self._bounds: dict[int, tuple[Any, tuple]] = {}
        # Amax already taken of a tensor (or a bound of it), by id; the tensor is
        # kept, so the id stays its own.
        self._measured: dict[int, tuple[Any, Any]] = {}

    def add(self, index: int, slot: int, value: Any) -> None:
        self.values.setdefault((index, slot), []).append(value)

    def known(self, tensor: Any) -> Any | None:
        """The amax bits recorded for `tensor` in this step, or `None`."""
        known = self._measured.get(id(tensor))
        if known is not None and known[0] is tensor:
            return known[1]
        return None

    def add_lazy(self, index: int, slot: int, parts: list) -> None:
        """Records a slot measured only if the step fails (`parts`: tensors or amax bits)."""
        self.lazy.append(((index + 1) * len(SLOTS) + slot, parts))

    def lazy_parts(self, tensor: Any) -> list:
        """What `tensor`'s amax is taken from when measured lazily: its bits, a bound, or itself."""
        bits = self.known(tensor)
        if bits is not None:
            return [bits]
        bound = self._bounds.get(id(tensor))
        if bound is not None and bound[0] is tensor:
            return list(bound[1])
        return [tensor]

    def bound_lazily(self, tensor: Any, parts: list) -> None:
        """Makes `tensor`'s amax, when measured lazily, the largest of `parts`."""
        self._bounds[id(tensor)] = (tensor, tuple(parts))

    def is_lazy(self, tensor: Any) -> bool:
        bound = self._bounds.get(id(tensor))
        return bound is not None and bound[0] is tensor

    def forget(self) -> None:
        """Drops every measured tensor (they belong to a function that has returned)."""
        self._measured.clear()

    def remember(self, tensor: Any, bits: Any) -> None:
        self._measured[id(tensor)] = (tensor, bits)

    def amax(self, tensor: Any) -> Any:
        """The amax bits of `tensor`, taken once per traced step however many layers read it."""
        bits = self.known(tensor)
        if bits is None:
            bits = amax_bits(tensor, self.integer)
            self.remember(tensor, bits)
        return bits


def _active_trace() -> _StepTrace | None:
    return getattr(_ACTIVE, "trace", None)


def _is_float_tensor(value: object) -> bool:
    dtype = getattr(value, "dtype", None)
    if dtype is None or not hasattr(value, "shape"):
        return False
    try:
        return keras.backend.is_float_dtype(keras.backend.standardize_dtype(dtype))
    except (TypeError, ValueError):
        return False


def amax_bits(tensor: Any, integer: bool = True) -> Any:
    """Returns the float32 bit pattern (int32) of `tensor`'s largest magnitude, NaN and inf kept.

    With `integer`, the sign bit of each value's bit pattern is masked and the
    patterns reduced with an integer maximum, in the tensor's own width (16
    bits for float16 and bfloat16): no float32 copy, and inf or NaN come out
    as inf or NaN (NaN above inf), whatever the reduction does with float NaN.
    Without it, `max(abs(x))` in the tensor's dtype (for devices without fast
    integer reductions).

    Args:
        tensor: a float tensor (or `IndexedSlices`).
        integer: whether to reduce the bit patterns as integers.

    Returns:
        An int32 scalar: the bits of the amax as float32 (0 for an empty tensor).

    Example:

    ```python
    bits = amax_bits(keras.ops.convert_to_tensor([1.0, -3.0], "float16"))
    bit_view(bits, "float32")  # 3.0
    ```
    """
    if hasattr(tensor, "indices") and hasattr(tensor, "values"):  # IndexedSlices
        tensor = tensor.values
    if any(dim == 0 for dim in tensor.shape):
        return ops.convert_to_tensor(0, "int32")
    dtype = keras.backend.standardize_dtype(tensor.dtype)
    if not integer:
        largest = ops.cast(ops.max(ops.abs(tensor)), FLOAT32)
        return bit_view(largest, "int32")
    if dtype not in _BITS_DTYPE:
        tensor, dtype = ops.cast(tensor, FLOAT32), FLOAT32
    bits_dtype = _BITS_DTYPE[dtype]
    mask = ops.convert_to_tensor(_MAGNITUDE_BITS[dtype], bits_dtype)
    largest = ops.max(ops.bitwise_and(bit_view(tensor, bits_dtype), mask))
    if dtype == "bfloat16":  # the upper half of a float32
        return ops.left_shift(ops.cast(largest, "int32"), ops.convert_to_tensor(16, "int32"))
    if dtype == FLOAT16:
        return bit_view(ops.cast(bit_view(largest, FLOAT16), FLOAT32), "int32")
    return largest


def bit_view(tensor: Any, dtype: str) -> Any:
    """Returns `tensor`'s bits read as `dtype` of the same width, on the active backend.

    The backend's own bitcast (`tf.bitcast`, `jax.lax.bitcast_convert_type`), which
    takes scalars on every Keras version the package supports.

    Args:
        tensor: a tensor.
        dtype: a dtype of the same item size, e.g. `"int16"` for float16.

    Returns:
        The tensor of `dtype`, same shape.

    Example:

    ```python
    bit_view(keras.ops.convert_to_tensor(1.0, "float32"), "int32")  # 1065353216
    ```
    """
    return telemetry_backend().bitcast(tensor, dtype)


def bits_to_float(bits: Any) -> Any:
    """Returns the float32 value of an int32 bit pattern from `amax_bits`."""
    return bit_view(bits, FLOAT32)


def _nan_max(first: Any, second: Any) -> np.float32:
    """The larger of two recorded amax values, NaN when either is (`None` counts as absent)."""
    if first is None:
        return np.float32(second)
    return np.float32(np.maximum(np.float32(first), np.float32(second)))


def _is_bounded(layer: keras.layers.Layer) -> bool:
    """Whether a layer only moves, selects or clips values (its outputs are no larger)."""
    return type(layer).__name__ in BOUNDED_PASS_THROUGH and is_pass_through(layer)


def _copy_keras_attributes(source: object, target: object) -> None:
    for name in _KERAS_TENSOR_ATTRIBUTES:
        value = getattr(source, name, None)
        if value is not None:
            try:
                setattr(target, name, value)
            except AttributeError:  # a tensor type without a __dict__
                pass


def telemetry_paths(model: keras.Model, dtypes: Mapping[str, str]) -> list[str]:
    """Returns the paths of the layers the telemetry records: 16-bit layers that compute.

    Left out: float32 layers, input layers, nested Sequential/Functional models
    (their outputs are their last layers'), pass-through layers (they copy or
    select their input) and layers run inside a recurrent layer's loop.

    Args:
        model: the model.
        dtypes: `{path: dtype}` the layers compute in (a `PlanHandle.dtypes`).

    Returns:
        The recorded paths, in model order.

    Example:

    ```python
    telemetry_paths(model, {"dense": "float16", "head": "float32"})  # ["dense"]
    ```
    """
    paths = layer_paths(model)
    loops = tuple(
        path + "/" for path, layer in paths.items() if isinstance(layer, keras.layers.RNN)
    )
    chosen = []
    for path, layer in paths.items():
        if dtypes.get(path, FLOAT32) == FLOAT32 or type(layer).__name__ == "InputLayer":
            continue
        if is_graph_model(layer) or is_pass_through(layer):
            continue
        if loops and path.startswith(loops):
            continue
        chosen.append(path)
    return chosen


class GuardTelemetry:
    """Records every 16-bit layer's amax inside the compiled train step, with a short history.

    Args:
        model: a compiled, built model.
        dtypes: `{path: dtype}` the layers compute in, in model order.
        history_steps: how many steps of history are kept on the device.
        near_binades: a float16 amax within this many binades of 65504 that sets
            a new record raises the status' `near_range` flag.

    Raises:
        BackendError: on a Keras backend other than TensorFlow and JAX.

    Example:

    ```python
    telemetry = GuardTelemetry(model, handle.dtypes)
    telemetry.install()
    ```
    """

    def __init__(
        self,
        model: keras.Model,
        dtypes: Mapping[str, str],
        history_steps: int = 16,
        near_binades: float = 2.0,
    ) -> None:
        self.backend = telemetry_backend("the autoprec guard's telemetry")
        self._jax = keras.backend.backend() == "jax"
        self.model = model
        self.dtypes = dict(dtypes)
        self.paths = telemetry_paths(model, dtypes)
        self.history_steps = int(history_steps)
        self.near_threshold = FORMAT_MAX[FLOAT16] / 2.0**near_binades
        self.installed = False
        self._index = {path: index for index, path in enumerate(self.paths)}
        self._float16 = np.array([self.dtypes[path] == FLOAT16 for path in self.paths], bool)
        self._undo: list[Callable[[], None]] = []
        self._read_count = 0
        self._integer = True
        self._pending_gradients: dict[int, np.ndarray] = {}
        rows = len(self.paths) + 1
        self._history = self.backend.replica_local_variable(
            np.full((self.history_steps, rows, len(SLOTS)), NOT_RECORDED, np.float32),
            "autoprec_guard_history",
        )
        self._count = self.backend.replica_local_variable(np.int64(0), "autoprec_guard_steps")
        self._status = self.backend.replica_local_variable(
            np.zeros(2, np.int32), "autoprec_guard_status"
        )

    # ------------------------------------------------------------------ installing

    def install(self) -> None:
        """Wraps the train step, the recorded layers' calls and `apply_gradients`.

        The caller rebuilds the train function (`model.make_train_function(force=True)`).
        """
        if self.installed:
            return
        previous = _INSTALLED.get(id(self.model))
        if previous is not None and previous.model is self.model and previous.installed:
            previous.remove()  # left installed by an earlier fit: its wrappers would nest
        _INSTALLED[id(self.model)] = self
        self._integer = self.backend.integer_amax_is_fast(
            bool(getattr(self.model, "jit_compile", False))
        )
        paths = layer_paths(self.model)
        optimizer = self.model.optimizer
        owners = self._weight_owners(paths)
        if self._jax:
            self._install_jax_step(owners)
        else:
            self._replace(self.model, "train_step", self._wrap_train_step(self.model.train_step))
            self._replace(
                optimizer, "apply_gradients", self._wrap_apply(optimizer.apply_gradients, owners)
            )
        for path in self.paths:
            layer = paths[path]
            index = self._index[path]
            self._replace(layer, "call", self._wrap_call(index, layer.call))
            if isinstance(layer, keras.layers.MultiHeadAttention) and self._float16[index]:
                self._replace(
                    layer,
                    "_compute_attention",
                    observing_attention(
                        layer, layer._compute_attention, self._attention_sink(index)
                    ),
                )
        for path, layer in paths.items():
            if path not in self._index and _is_bounded(layer):
                self._replace(layer, "call", self._wrap_bounded_call(layer.call))
        self.installed = True

    def remove(self) -> None:
        """Restores every wrapped method (the caller rebuilds the train function)."""
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        self.installed = False
        if _INSTALLED.get(id(self.model)) is self:
            del _INSTALLED[id(self.model)]

    def _replace(self, owner: object, name: str, value: object) -> None:
        self._undo.append(swap_attribute(owner, name, value))

    def _weight_owners(self, paths: Mapping[str, keras.layers.Layer]) -> dict[int, int]:
        owners: dict[int, int] = {}
        for path, layer in paths.items():  # parents first: the deepest recorded owner wins
            index = self._index.get(path)
            if index is None:
                continue
            for weight in layer.trainable_weights:
                owners[id(weight)] = index
        return owners

    # ------------------------------------------------------------------ recording (traced)

    def _wrap_train_step(self, original: Callable) -> Callable:
        telemetry = self

        @functools.wraps(original)
        def train_step(data):
            trace = _StepTrace(telemetry._integer)
            _ACTIVE.trace = trace
            try:
                scale = telemetry._loss_scale()
                batch = [
                    amax_bits(value, trace.integer)
                    for value in keras.tree.flatten(data)
                    if _is_float_tensor(value)
                ]
                outputs = original(data)
            finally:
                _ACTIVE.trace = None
            telemetry._write(trace, scale, batch)
            return outputs

        return train_step

    def _wrap_call(self, index: int, original: Callable) -> Callable:
        telemetry = self

        @functools.wraps(original)
        def call(*args, **kwargs):
            trace = _active_trace()
            if trace is None:
                return original(*args, **kwargs)
            lazy = telemetry._lazy(index)
            for value in keras.tree.flatten((args, kwargs)):
                if not _is_float_tensor(value):
                    continue
                if lazy:
                    trace.add_lazy(index, INPUT, trace.lazy_parts(value))
                else:
                    trace.add(index, INPUT, telemetry._eager_amax(trace, value))
            outputs = original(*args, **kwargs)
            return telemetry._observe(trace, index, outputs)

        return call

    def _wrap_bounded_call(self, original: Callable) -> Callable:
        """A pass-through layer's outputs inherit the largest amax of its inputs, as a bound."""

        @functools.wraps(original)
        def call(*args, **kwargs):
            outputs = original(*args, **kwargs)
            trace = _active_trace()
            if trace is None:
                return outputs
            inputs = [v for v in keras.tree.flatten((args, kwargs)) if _is_float_tensor(v)]
            known = [trace.known(value) for value in inputs]
            outputs_flat = [v for v in keras.tree.flatten(outputs) if _is_float_tensor(v)]
            if known and all(bits is not None for bits in known):
                bound = known[0] if len(known) == 1 else ops.max(ops.stack(known))
                for value in outputs_flat:
                    trace.remember(value, bound)
            elif known and all(
                bits is not None or trace.is_lazy(value) for bits, value in zip(known, inputs)
            ):
                parts = [part for value in inputs for part in trace.lazy_parts(value)]
                for value in outputs_flat:
                    trace.bound_lazily(value, parts)
            # else: an input nobody measured; its reader measures it
            return outputs

        return call

    def _observe(self, trace: _StepTrace, index: int, outputs: Any) -> Any:
        flat = keras.tree.flatten(outputs)
        if not any(_is_float_tensor(value) for value in flat):
            return outputs
        if not self._float16[index]:  # no activation gradients: outputs measured as they are
            lazy = self._lazy(index)
            for value in flat:
                if not _is_float_tensor(value):
                    continue
                if lazy:
                    trace.add_lazy(index, OUTPUT, [value])
                    trace.bound_lazily(value, [value])
                else:
                    trace.add(index, OUTPUT, self._eager_amax(trace, value))
            return outputs
        integer = trace.integer
        jax_host = self.backend.host_callback if self._jax else None

        @ops.custom_gradient
        def identity(value):
            def gradient(*args, upstream=None):
                if upstream is None:
                    (upstream,) = args
                current = _active_trace()
                if current is not None and jax_host is not None:
                    # A JAX gradient function is traced on its own: its values leave by callback.
                    jax_host(functools.partial(self._host_gradient, index), amax_bits(upstream))
                elif current is not None:
                    current.add(index, GRADIENT, amax_bits(upstream, integer))
                return upstream

            return ops.copy(value), gradient

        observed = []
        for value in flat:
            if not _is_float_tensor(value):
                observed.append(value)
                continue
            result = identity(value)
            trace.add(index, OUTPUT, self._eager_amax(trace, result))
            _copy_keras_attributes(value, result)
            observed.append(result)
        if len(flat) == 1 and not isinstance(outputs, (list, tuple, dict)):
            return observed[0]
        return keras.tree.pack_sequence_as(outputs, observed)

    def _lazy(self, index: int) -> bool:
        """Whether a layer's values are measured only in failing steps: bfloat16 on TensorFlow.

        A bfloat16 layer has float32's range: its values leave it only as inf or
        NaN, which reach the gradients (or came with the batch), and it has no
        climbing amax to watch. Its outputs are measured, inside that same step,
        only when the step's gradients or batch are non-finite (a conditional
        branch that normal steps skip). JAX measures every step (XLA fuses the
        reductions into the layers' own loops).
        """
        return not self._jax and not self._float16[index]

    def _eager_amax(self, trace: _StepTrace, value: Any) -> Any:
        """The amax bits of `value` now (a lazily bounded tensor is measured itself)."""
        return trace.amax(value)

    def _attention_sink(self, index: int) -> Callable[[], Callable[[Any], None] | None]:
        def sink() -> Callable[[Any], None] | None:
            trace = _active_trace()
            if trace is None:
                return None
            return lambda logits: trace.add(index, INTERNAL, amax_bits(logits, trace.integer))

        return sink

    def _wrap_apply(self, original: Callable, owners: Mapping[int, int]) -> Callable:
        @functools.wraps(original)
        def apply_gradients(grads_and_vars, *args, **kwargs):
            pairs = list(grads_and_vars)
            trace = _active_trace()
            if trace is not None:
                for gradient, variable in pairs:
                    if gradient is None:
                        continue
                    value = amax_bits(gradient, trace.integer)
                    trace.all_gradients.append(value)
                    index = owners.get(id(variable))
                    if index is not None:
                        trace.add(index, GRADIENT, value)
            return original(pairs, *args, **kwargs)

        return apply_gradients

    def _loss_scale(self) -> Any:
        optimizer = self.model.optimizer
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            return ops.cast(ops.convert_to_tensor(optimizer.dynamic_scale), "float32")
        return ops.convert_to_tensor(1.0, "float32")

    def _frame(
        self,
        trace: _StepTrace,
        scale: Any,
        batch: list,
        packed: tuple[Any, list[int]] | None = None,
    ) -> tuple[Any, Any]:
        """Returns the step's `(frame, gradients_bad)`: one segment maximum of every scalar."""
        rows = len(self.paths) + 1
        values = [bit_view(scale, "int32")]
        segments = [0]
        for bits in batch:
            values.append(bits)
            segments.append(1)
        for bits in trace.all_gradients:
            values.append(bits)
            segments.append(2)
        for (index, slot), recorded in trace.values.items():
            values.extend(recorded)
            segments.extend([(index + 1) * len(SLOTS) + slot] * len(recorded))
        stacked = ops.stack(values)
        if trace.lazy:
            stacked = ops.concatenate([stacked, self._lazy_values(trace, values[1:])])
            segments.extend(segment for segment, _ in trace.lazy)
        if packed is not None and packed[1]:  # values recorded inside the gradient function
            stacked = ops.concatenate([stacked, packed[0]])
            segments.extend(packed[1])
        largest = ops.segment_max(
            stacked,
            ops.convert_to_tensor(np.array(segments, np.int32)),
            num_segments=rows * len(SLOTS),
        )
        # Empty segments hold the smallest int32: nothing recorded there.
        recorded = ops.greater_equal(largest, ops.convert_to_tensor(0, "int32"))
        missing = ops.convert_to_tensor(_NOT_RECORDED_BITS, "int32")
        frame = ops.reshape(
            bits_to_float(ops.where(recorded, largest, missing)), (rows, len(SLOTS))
        )
        # Row 0 is (loss scale, batch amax, gradients non-finite, unused).
        gradients_bad = ops.cast(ops.logical_not(ops.isfinite(frame[0, 2])), "float32")
        if not batch:
            frame = ops.where(self._header_mask(1), 0.0, frame)
        frame = ops.where(self._header_mask(2), gradients_bad, frame)
        return frame, gradients_bad

    def _lazy_values(self, trace: _StepTrace, triggers: list) -> Any:
        """The lazily measured slots, computed only when a value already taken is non-finite.

        The triggers are the batch's, the gradients' and the float16 layers' amax
        bits: a non-finite value in a bfloat16 layer reaches the gradients.
        """
        entries = trace.lazy
        tensors = {
            id(part): part for _, parts in entries for part in parts if _is_float_tensor(part)
        }

        def measure():
            bits = {key: amax_bits(tensor, trace.integer) for key, tensor in tensors.items()}
            rows = []
            for _, parts in entries:
                values = [bits[id(part)] if id(part) in bits else part for part in parts]
                rows.append(values[0] if len(values) == 1 else ops.max(ops.stack(values)))
            return ops.stack(rows)

        def skip():
            return ops.full((len(entries),), np.iinfo(np.int32).min, "int32")

        if not triggers:
            return skip()
        infinity = ops.convert_to_tensor(_INFINITY_BITS, "int32")
        failing = ops.any(ops.greater_equal(ops.stack(triggers), infinity))
        return ops.cond(failing, measure, skip)

    def _write(self, trace: _StepTrace, scale: Any, batch: list) -> None:
        """Appends the step's frame to the device history with one update; sets the status."""
        frame, gradients_bad = self._frame(trace, scale, batch)
        history = ops.convert_to_tensor(self._history)
        failed = ops.logical_or(
            ops.logical_not(ops.all(ops.isfinite(frame))), ops.greater(gradients_bad, 0.0)
        )
        near = ops.convert_to_tensor(False)
        if self._float16.any():
            current = ops.maximum(frame[1:, OUTPUT], frame[1:, INTERNAL])
            past = ops.max(ops.maximum(history[:, 1:, OUTPUT], history[:, 1:, INTERNAL]), axis=0)
            near = ops.any(
                ops.logical_and(
                    ops.convert_to_tensor(self._float16),
                    ops.logical_and(
                        ops.greater_equal(current, self.near_threshold),
                        ops.logical_and(ops.greater(current, past), ops.isfinite(current)),
                    ),
                )
            )
        self._history.assign(ops.concatenate([history[1:], frame[None]], axis=0))
        self._count.assign_add(ops.convert_to_tensor(1, "int64"))
        code = ops.cast(ops.stack([failed, near]), "int32")
        self._status.assign(ops.maximum(ops.convert_to_tensor(self._status), code))

    # ------------------------------------------------------------------ JAX

    def _install_jax_step(self, owners: Mapping[int, int]) -> None:
        """Wraps the JAX trainer's pure train step, its loss function and `stateless_apply`.

        Values recorded in the forward pass leave the differentiated loss function
        as one extra entry of its auxiliary outputs; the step's frame leaves the
        compiled step through one host callback.
        """
        model = self.model
        optimizer = model.optimizer
        scale_position = None
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            scale_position = next(
                position
                for position, variable in enumerate(optimizer.variables)
                if variable is optimizer.dynamic_scale
            )
        positions = {
            position: owners[id(variable)]
            for position, variable in enumerate(model.trainable_variables)
            if id(variable) in owners
        }
        self._replace(
            model, "train_step", self._wrap_jax_train_step(model.train_step, scale_position)
        )
        self._replace(
            model,
            "compute_loss_and_updates",
            self._wrap_jax_loss(model.compute_loss_and_updates),
        )
        self._replace(
            optimizer,
            "stateless_apply",
            self._wrap_stateless_apply(optimizer.stateless_apply, positions),
        )

    def _wrap_jax_train_step(self, original: Callable, scale_position: int | None) -> Callable:
        telemetry = self

        @functools.wraps(original)
        def train_step(state, data):
            trace = _StepTrace(True, owner=telemetry)
            _ACTIVE.trace = trace
            try:
                scale = (
                    ops.cast(state[2][scale_position], "float32")
                    if scale_position is not None
                    else ops.convert_to_tensor(1.0, "float32")
                )
                batch = [
                    amax_bits(value, True)
                    for value in keras.tree.flatten(data)
                    if _is_float_tensor(value)
                ]
                logs, state = original(state, data)
            finally:
                _ACTIVE.trace = None
            trainable, non_trainable, optimizer_state, metrics = state
            packed = (non_trainable[-1], trace.packed_segments)
            frame, _ = telemetry._frame(trace, scale, batch, packed)
            telemetry.backend.host_callback(telemetry._host_write, frame)
            return logs, (trainable, list(non_trainable[:-1]), optimizer_state, metrics)

        return train_step

    def _wrap_jax_loss(self, original: Callable) -> Callable:
        telemetry = self

        @functools.wraps(original)
        def compute_loss_and_updates(*args, **kwargs):
            trace = _active_trace()
            if trace is None or trace.owner is not telemetry:  # not this telemetry's train step
                return original(*args, **kwargs)
            loss, (unscaled, y_pred, non_trainable, metrics) = original(*args, **kwargs)
            values: list = []
            segments: list[int] = []
            for (index, slot), recorded in trace.values.items():
                values.extend(recorded)
                segments.extend([(index + 1) * len(SLOTS) + slot] * len(recorded))
            trace.values = {}
            trace.forget()  # the tensors measured here live in this function only
            trace.packed_segments = segments
            packed = ops.stack(values) if values else ops.zeros((0,), "int32")
            return loss, (unscaled, y_pred, [*non_trainable, packed], metrics)

        return compute_loss_and_updates

    def _wrap_stateless_apply(self, original: Callable, positions: Mapping[int, int]) -> Callable:
        @functools.wraps(original)
        def stateless_apply(optimizer_variables, grads, trainable_variables):
            trace = _active_trace()
            if trace is not None:
                for position, gradient in enumerate(grads):
                    if gradient is None:
                        continue
                    value = amax_bits(gradient, True)
                    trace.all_gradients.append(value)
                    if position in positions:
                        trace.add(positions[position], GRADIENT, value)
            return original(optimizer_variables, grads, trainable_variables)

        return stateless_apply

    def _host_gradient(self, index: int, bits: np.ndarray) -> None:
        """Keeps a float16 layer's activation-gradient amax until its step's frame arrives."""
        value = np.asarray(bits, np.int32).view(np.float32)
        self._pending_gradients[index] = _nan_max(self._pending_gradients.get(index), value)

    def _host_write(self, frame: np.ndarray) -> None:
        """The host side of one JAX step: the same history and status updates as in-graph."""
        frame = np.array(frame, np.float32)
        for index, value in self._pending_gradients.items():
            frame[index + 1, GRADIENT] = _nan_max(frame[index + 1, GRADIENT], value)
            if not np.isfinite(value):
                frame[0, 2] = 1.0
        self._pending_gradients = {}
        history = self._history.value
        failed = not np.isfinite(frame).all() or frame[0, 2] > 0
        near = False
        if self._float16.any():
            current = np.maximum(frame[1:, OUTPUT], frame[1:, INTERNAL])
            past = np.max(np.maximum(history[:, 1:, OUTPUT], history[:, 1:, INTERNAL]), axis=0)
            with np.errstate(invalid="ignore"):
                near = bool(
                    np.any(
                        self._float16
                        & (current >= self.near_threshold)
                        & (current > past)
                        & np.isfinite(current)
                    )
                )
        self._history.value = np.concatenate([history[1:], frame[None]], axis=0)
        self._count.value = self._count.value + 1
        self._status.value = np.maximum(self._status.value, np.array([failed, near], np.int32))

    def _header_mask(self, slot: int) -> Any:
        mask = np.zeros((len(self.paths) + 1, len(SLOTS)), bool)
        mask[0, slot] = True
        return ops.convert_to_tensor(mask)

    # ------------------------------------------------------------------ reading (host)

    def read_status(self) -> TelemetryStatus:
        """Returns the status flags set since the last `clear_status` (one small read)."""
        flags = np.max(np.stack(self.backend.replica_values(self._status)), axis=0)
        return TelemetryStatus(failed=bool(flags[0]), near_range=bool(flags[1]))

    def clear_status(self) -> None:
        """Resets the status flags (after the host has acted on them)."""
        self.backend.assign_every_replica(self._status, np.zeros(2, np.int32))

    def steps_recorded(self) -> int:
        """Returns how many train steps the telemetry has recorded."""
        return int(max(int(value) for value in self.backend.replica_values(self._count)))

    def read_records(self, new_only: bool = False) -> list[StepRecord]:
        """Returns the recorded steps still in the history, oldest first.

        Args:
            new_only: only the steps recorded since the last call with `new_only=True`.

        Returns:
            One `StepRecord` per step (combined over replicas: the largest values).
        """
        count = self.steps_recorded()
        available = min(count, self.history_steps)
        if new_only:
            available = min(available, count - self._read_count)
            self._read_count = count
        if available <= 0:
            return []
        history = np.max(np.stack(self.backend.replica_values(self._history)), axis=0)
        records = []
        for offset in range(available, 0, -1):
            frame = history[-offset]
            layers = {
                path: LayerAmax(*(float(value) for value in frame[index + 1]))
                for index, path in enumerate(self.paths)
            }
            records.append(
                StepRecord(
                    index=count - offset + 1,
                    loss_scale=float(frame[0, 0]),
                    batch_amax=float(frame[0, 1]),
                    gradients_finite=not frame[0, 2] > 0,
                    layers=layers,
                )
            )
        return records
