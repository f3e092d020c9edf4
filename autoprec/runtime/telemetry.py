"""Per-layer amax telemetry inside the compiled train step: the frame layout, the records the host
reads, the trace of one step, and the logs of a guarded run (a skipped step leaves no NaN)."""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from .. import numerics
from .._backends import instrument_backend
from .._backends.instrument import (
    FLOAT32_INFINITY_BITS,
    amax_bits,
    bit_view,
    bits_to_float,
    is_float_tensor,
)
from .._core.dtypes import BFLOAT16, FLOAT16, FLOAT32
from .._core.models import call_model_code, swap_attribute
from ..instrument import instrumented_layers, replace_float_outputs
from ..layers import (
    PASS_THROUGH_CLASSES,
    is_pass_through,
    layer_paths,
    observing_attention,
)

#: What is recorded for every 16-bit layer, in this order.
SLOTS = ("output", "input", "internal", "gradient")
OUTPUT, INPUT, INTERNAL, GRADIENT = range(len(SLOTS))
#: The value of a slot nothing was recorded in.
NOT_RECORDED = -1.0
#: `NOT_RECORDED` as the int32 bits of a float32 (how an amax travels inside a step).
NOT_RECORDED_BITS = int(np.array(NOT_RECORDED, np.float32).view(np.int32))
#: Header columns of row 0 of a frame.
HEADER_LOSS_SCALE, HEADER_BATCH_AMAX, HEADER_GRADIENTS_BAD = range(3)
#: The largest finite value of each compute dtype, from `numerics` (`ml_dtypes.finfo`).
FORMAT_MAX: Mapping[str, float] = {
    name: numerics.float_format(name).max for name in (FLOAT16, BFLOAT16, FLOAT32)
}


def frame_segment(index: int, slot: int) -> int:
    """Returns the flat position in a frame of recorded layer `index`'s `slot`."""
    return (index + 1) * len(SLOTS) + slot


def format_max(dtype: str) -> float:
    """Returns the largest finite value of a compute dtype (float32's for unknown names)."""
    return FORMAT_MAX.get(dtype, FORMAT_MAX[FLOAT32])


def is_out_of_range(value: float, dtype: str) -> bool:
    """Returns whether a recorded amax is non-finite or above `dtype`'s largest value."""
    if value == NOT_RECORDED:
        return False
    return not math.isfinite(value) or value > format_max(dtype)


@dataclasses.dataclass(frozen=True)
class LayerAmax:
    """The maxima of `|x|` one layer recorded in one step (`NOT_RECORDED` where nothing was)."""

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
    """What the telemetry recorded for one train step."""

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
    """The one small tensor the host reads after each step."""

    failed: bool = False
    near_range: bool = False

    def __bool__(self) -> bool:
        return self.failed or self.near_range


def step_record(frame: np.ndarray, index: int, paths: Sequence[str]) -> StepRecord:
    """Returns the `StepRecord` a host frame spells."""
    layers = {
        path: LayerAmax(*(float(value) for value in frame[row + 1]))
        for row, path in enumerate(paths)
    }
    return StepRecord(
        index=index,
        loss_scale=float(frame[0, HEADER_LOSS_SCALE]),
        batch_amax=float(frame[0, HEADER_BATCH_AMAX]),
        gradients_finite=not frame[0, HEADER_GRADIENTS_BAD] > 0,
        layers=layers,
    )


def status_flags(
    frame: Any, history: Any, float16: np.ndarray, near_threshold: float, xp: Any
) -> tuple[Any, Any]:
    """Returns `(failed, near_range)` for a new frame, in-graph (`keras.ops`) or on the host
    (NumPy)."""
    failed = xp.logical_or(
        xp.logical_not(xp.all(xp.isfinite(frame))),
        xp.greater(frame[0, HEADER_GRADIENTS_BAD], 0.0),
    )
    if not float16.any():
        return failed, xp.array(False)
    current = xp.maximum(frame[1:, OUTPUT], frame[1:, INTERNAL])
    past = xp.max(xp.maximum(history[:, 1:, OUTPUT], history[:, 1:, INTERNAL]), axis=0)
    with np.errstate(invalid="ignore"):  # NaN compares as False on the host, as in-graph
        rising = xp.logical_and(xp.greater(current, past), xp.isfinite(current))
        near = xp.any(
            xp.logical_and(
                float16, xp.logical_and(xp.greater_equal(current, near_threshold), rising)
            )
        )
    return failed, near


_ACTIVE = threading.local()  # the step being traced, per replica thread


class StepTrace:
    """Tensors recorded while one train step is traced (in one replica's thread)."""

    def __init__(self, integer: bool, owner: object = None, batch: list | None = None) -> None:
        self.integer = integer
        self.owner = owner
        self.batch: list = list(batch or [])
        self.values: dict[tuple[int, int], list] = {}
        self.all_gradients: list = []
        # Slots measured only in a step whose gradients or batch are non-finite:
        # (segment, parts), each part a tensor or amax bits.
        self.lazy: list[tuple[int, list]] = []
        self._bounds: dict[int, tuple[Any, tuple]] = {}
        # Amax already taken of a tensor (or a bound of it), by id; the tensor is
        # kept, so the id stays its own.
        self._measured: dict[int, tuple[Any, Any]] = {}

    def add(self, index: int, slot: int, value: Any) -> None:
        """Records amax bits in recorded layer `index`'s `slot` (the largest of all counts)."""
        self.values.setdefault((index, slot), []).append(value)

    def known(self, tensor: Any) -> Any | None:
        """The amax bits recorded for `tensor` in this step, or `None`."""
        known = self._measured.get(id(tensor))
        if known is not None and known[0] is tensor:
            return known[1]
        return None

    def add_lazy(self, index: int, slot: int, parts: list) -> None:
        """Records a slot measured only if the step fails (`parts`: tensors or amax bits)."""
        self.lazy.append((frame_segment(index, slot), parts))

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
        """Whether `tensor` has a lazy bound in this step."""
        bound = self._bounds.get(id(tensor))
        return bound is not None and bound[0] is tensor

    def forget(self) -> None:
        """Drops every measured tensor (they belong to a function that has returned)."""
        self._measured.clear()

    def remember(self, tensor: Any, bits: Any) -> None:
        """Records `bits` as `tensor`'s amax (or a bound of it) for the rest of the step."""
        self._measured[id(tensor)] = (tensor, bits)

    def amax(self, tensor: Any) -> Any:
        """The amax bits of `tensor`, taken once per traced step however many layers read it."""
        bits = self.known(tensor)
        if bits is None:
            bits = amax_bits(tensor, self.integer)
            self.remember(tensor, bits)
        return bits

    def gradients_finite(self) -> Any:
        """Whether every gradient recorded so far in this step is finite (a traced boolean scalar)."""
        if not self.all_gradients:
            return ops.convert_to_tensor(True)
        infinity = ops.convert_to_tensor(FLOAT32_INFINITY_BITS, "int32")
        return ops.all(ops.less(ops.stack(self.all_gradients), infinity))

    def take_values(self) -> tuple[Any, list[int]]:
        """Returns `(stacked bits, frame segments)` of the slots recorded so far, and drops them."""
        values: list = []
        segments: list[int] = []
        for (index, slot), recorded in self.values.items():
            values.extend(recorded)
            segments.extend([frame_segment(index, slot)] * len(recorded))
        self.values = {}
        self.forget()
        packed = ops.stack(values) if values else ops.zeros((0,), "int32")
        return packed, segments


def open_trace(trace: StepTrace) -> None:
    """Makes `trace` the one this thread's layer wrappers record into."""
    _ACTIVE.trace = trace


def close_trace() -> None:
    """Ends recording in this thread."""
    _ACTIVE.trace = None


def active_trace() -> StepTrace | None:
    """Returns the trace open in this thread, or `None` outside a recorded train step."""
    return getattr(_ACTIVE, "trace", None)


def build_frame(
    trace: StepTrace, rows: int, scale: Any, extra: tuple[Any, list[int]] | None = None
) -> Any:
    """Returns the step's frame: one segment maximum of every recorded scalar."""
    values = [bit_view(scale, "int32")]
    segments = [HEADER_LOSS_SCALE]
    values.extend(trace.batch)
    segments.extend([HEADER_BATCH_AMAX] * len(trace.batch))
    values.extend(trace.all_gradients)
    segments.extend([HEADER_GRADIENTS_BAD] * len(trace.all_gradients))
    for (index, slot), recorded in trace.values.items():
        values.extend(recorded)
        segments.extend([frame_segment(index, slot)] * len(recorded))
    stacked = ops.stack(values)
    if trace.lazy:
        stacked = ops.concatenate([stacked, _lazy_values(trace, values[1:])])
        segments.extend(segment for segment, _ in trace.lazy)
    if extra is not None and extra[1]:
        stacked = ops.concatenate([stacked, extra[0]])
        segments.extend(extra[1])
    largest = ops.segment_max(
        stacked,
        ops.convert_to_tensor(np.array(segments, np.int32)),
        num_segments=rows * len(SLOTS),
    )
    # Empty segments hold the smallest int32: nothing recorded there.
    recorded = ops.greater_equal(largest, ops.convert_to_tensor(0, "int32"))
    missing = ops.convert_to_tensor(NOT_RECORDED_BITS, "int32")
    frame = ops.reshape(bits_to_float(ops.where(recorded, largest, missing)), (rows, len(SLOTS)))
    gradients = frame[0, HEADER_GRADIENTS_BAD]
    gradients_bad = ops.cast(ops.logical_not(ops.isfinite(gradients)), "float32")
    if not trace.batch:
        frame = ops.where(_header_mask(rows, HEADER_BATCH_AMAX), 0.0, frame)
    return ops.where(_header_mask(rows, HEADER_GRADIENTS_BAD), gradients_bad, frame)


def _header_mask(rows: int, slot: int) -> Any:
    mask = np.zeros((rows, len(SLOTS)), bool)
    mask[0, slot] = True
    return ops.convert_to_tensor(mask)


def _lazy_values(trace: StepTrace, triggers: list) -> Any:
    """The lazily measured slots, computed only when a value already taken is non-finite."""
    entries = trace.lazy
    tensors = {id(part): part for _, parts in entries for part in parts if is_float_tensor(part)}

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
    infinity = ops.convert_to_tensor(FLOAT32_INFINITY_BITS, "int32")
    failing = ops.any(ops.greater_equal(ops.stack(triggers), infinity))
    return ops.cond(failing, measure, skip)


#: Pass-through layers whose outputs are never larger in magnitude than their
#: inputs (the dropout and noise layers scale or add, and are left out).
BOUNDED_PASS_THROUGH = frozenset(
    name
    for name in PASS_THROUGH_CLASSES
    if "Dropout" not in name and name not in ("GaussianNoise", "InputLayer")
)

# The telemetry installed on each model (by id), so that installing another removes it.
_INSTALLED: weakref.WeakValueDictionary[int, GuardTelemetry] = weakref.WeakValueDictionary()


def _is_bounded(layer: keras.layers.Layer) -> bool:
    """Whether a layer only moves, selects or clips values (its outputs are no larger)."""
    return type(layer).__name__ in BOUNDED_PASS_THROUGH and is_pass_through(layer)


def telemetry_paths(model: keras.Model, dtypes: Mapping[str, str]) -> list[str]:
    """Returns the paths of the layers the telemetry records: 16-bit layers that compute."""
    return [path for path in instrumented_layers(model) if dtypes.get(path, FLOAT32) != FLOAT32]


def remove_installed_telemetry(model: keras.Model) -> None:
    """Removes the telemetry an earlier `fit` left installed on `model`, if any."""
    previous = _INSTALLED.get(id(model))
    if previous is not None and previous.model is model and previous.installed:
        previous.remove()


class GuardTelemetry:
    """Records every 16-bit layer's amax inside the compiled train step, with a short history."""

    def __init__(
        self,
        model: keras.Model,
        dtypes: Mapping[str, str],
        history_steps: int = 16,
        near_binades: float = 2.0,
    ) -> None:
        backend = instrument_backend("the autoprec guard's telemetry")
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
        rows = len(self.paths) + 1
        self.hooks = backend.TelemetryHooks(
            np.full((self.history_steps, rows, len(SLOTS)), NOT_RECORDED, np.float32)
        )

    # ------------------------------------------------------------------ installing

    def install(self) -> None:
        """Wraps the train step, the recorded layers' calls and the optimizer's update."""
        if self.installed:
            return
        previous = _INSTALLED.get(id(self.model))
        if previous is not None and previous.model is self.model and previous.installed:
            previous.remove()  # left installed by an earlier fit: its wrappers would nest
        _INSTALLED[id(self.model)] = self
        self._integer = self.hooks.integer_amax_is_fast(
            bool(getattr(self.model, "jit_compile", False))
        )
        paths = layer_paths(self.model)
        for owner, name, wrapper in self.hooks.step_wrappers(
            self.model, self, self._weight_owners(paths)
        ):
            self._replace(owner, name, wrapper)
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

    # ------------------------------------------------------------------ called by the hooks

    def begin_step(self, data: Any) -> StepTrace:
        """Measures the step's input batch and opens its trace in this thread; returns it."""
        batch = [
            amax_bits(value, self._integer)
            for value in keras.tree.flatten(data)
            if is_float_tensor(value)
        ]
        trace = StepTrace(self._integer, owner=self, batch=batch)
        open_trace(trace)
        return trace

    def end_step(self) -> None:
        """Closes this thread's trace."""
        close_trace()

    def active_step(self) -> StepTrace | None:
        """Returns this telemetry's trace open in this thread, or `None`."""
        trace = active_trace()
        return trace if trace is not None and trace.owner is self else None

    def record_weight_gradient(self, trace: StepTrace, owner: int | None, gradient: Any) -> None:
        """Records a gradient the optimizer received (`owner`: the recorded layer's index)."""
        value = amax_bits(gradient, trace.integer)
        trace.all_gradients.append(value)
        if owner is not None:
            trace.add(owner, GRADIENT, value)

    def record_activation_gradient(self, trace: StepTrace, index: int, bits: Any) -> None:
        """Records the amax bits of the gradient flowing into recorded layer `index`."""
        trace.add(index, GRADIENT, bits)

    def frame(self, trace: StepTrace, scale: Any, extra: tuple[Any, list[int]] | None = None):
        """Returns the step's frame (see `build_frame`)."""
        return build_frame(trace, len(self.paths) + 1, scale, extra)

    def status_flags(self, frame: Any, history: Any, xp: Any) -> tuple[Any, Any]:
        """Returns `(failed, near_range)` of a frame after `history` (see `status_flags`)."""
        return status_flags(frame, history, self._float16, self.near_threshold, xp)

    # ------------------------------------------------------------------ recording (traced)

    def _wrap_call(self, index: int, original: Callable) -> Callable:
        telemetry = self

        @functools.wraps(original)
        def call(*args, **kwargs):
            trace = active_trace()
            if trace is None:
                return original(*args, **kwargs)
            layer = f"recording layer {telemetry.paths[index]!r}"
            lost = "its values will not be guarded"
            call_model_code(
                lambda: telemetry._observe_inputs(trace, index, (args, kwargs)),
                layer=layer,
                lost=lost,
                fallback=None,
            )
            outputs = original(*args, **kwargs)
            return call_model_code(
                lambda: telemetry._observe(trace, index, outputs),
                layer=layer,
                lost=lost,
                fallback=outputs,
            )

        return call

    def _observe_inputs(self, trace: StepTrace, index: int, inputs: Any) -> None:
        lazy = self._lazy(index)
        for value in keras.tree.flatten(inputs):
            if not is_float_tensor(value):
                continue
            if lazy:
                trace.add_lazy(index, INPUT, trace.lazy_parts(value))
            else:
                trace.add(index, INPUT, trace.amax(value))

    def _wrap_bounded_call(self, original: Callable) -> Callable:
        """A pass-through layer's outputs inherit the largest amax of its inputs, as a bound."""

        @functools.wraps(original)
        def call(*args, **kwargs):
            outputs = original(*args, **kwargs)
            trace = active_trace()
            if trace is None:
                return outputs
            inputs = [v for v in keras.tree.flatten((args, kwargs)) if is_float_tensor(v)]
            known = [trace.known(value) for value in inputs]
            outputs_flat = [v for v in keras.tree.flatten(outputs) if is_float_tensor(v)]
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

    def _observe(self, trace: StepTrace, index: int, outputs: Any) -> Any:
        flat = keras.tree.flatten(outputs)
        if not any(is_float_tensor(value) for value in flat):
            return outputs
        if not self._float16[index]:  # no activation gradients: outputs measured as they are
            lazy = self._lazy(index)
            for value in flat:
                if not is_float_tensor(value):
                    continue
                if lazy:
                    trace.add_lazy(index, OUTPUT, [value])
                    trace.bound_lazily(value, [value])
                else:
                    trace.add(index, OUTPUT, trace.amax(value))
            return outputs

        def watch(_: tuple, value: Any) -> Any:
            result = self.hooks.watch_gradient(self, trace, index, value)
            trace.add(index, OUTPUT, trace.amax(result))
            return result

        return replace_float_outputs(outputs, is_float_tensor, watch)

    def _lazy(self, index: int) -> bool:
        """Whether a layer's values are measured only in failing steps (bfloat16, if the hooks do)."""
        return self.hooks.measures_bfloat16_lazily and not self._float16[index]

    def _attention_sink(self, index: int) -> Callable[[], Callable[[Any], None] | None]:
        def sink() -> Callable[[Any], None] | None:
            trace = active_trace()
            if trace is None:
                return None
            return lambda logits: trace.add(index, INTERNAL, amax_bits(logits, trace.integer))

        return sink

    # ------------------------------------------------------------------ reading (host)

    def read_status(self) -> TelemetryStatus:
        """Returns the status flags set since the last `clear_status` (one small read)."""
        flags = self.hooks.read_status()
        return TelemetryStatus(failed=bool(flags[0]), near_range=bool(flags[1]))

    def clear_status(self) -> None:
        """Resets the status flags (after the host has acted on them)."""
        self.hooks.clear_status()

    def steps_recorded(self) -> int:
        """Returns how many train steps the telemetry has recorded."""
        return self.hooks.read_count()

    def read_records(self, new_only: bool = False) -> list[StepRecord]:
        """Returns the recorded steps still in the history, oldest first."""
        count = self.steps_recorded()
        available = min(count, self.history_steps)
        if new_only:
            available = min(available, count - self._read_count)
            self._read_count = count
        if available <= 0:
            return []
        history = self.hooks.read_history()
        return [
            step_record(history[-offset], count - offset + 1, self.paths)
            for offset in range(available, 0, -1)
        ]


#: The key `fit`'s logs gain while the guard is on.
SKIPPED_STEPS = "skipped_steps"

_STEP_LOGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class SkippedStepLogs:
    """Keeps a guarded run's logs finite and counts its skipped steps."""

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        self.active = False
        self.supported = keras.backend.backend() == "tensorflow"
        self._skipped_at_epoch_start = None
        if self.supported:
            swap_attribute(model, "train_step", self._wrap(model.train_step))

    @classmethod
    def for_model(cls, model: keras.Model) -> SkippedStepLogs:
        """Returns the model's `SkippedStepLogs`, installing it on first use."""
        logs = _STEP_LOGS.get(model)
        if logs is None:
            logs = cls(model)
            _STEP_LOGS[model] = logs
        return logs

    def activate(self) -> None:
        """Keeps the logs finite from the next trace of the train step on."""
        self.active = True

    def deactivate(self) -> None:
        """Lets the train step report as Keras reports, from its next trace on."""
        self.active = False

    def start_epoch(self) -> None:
        """Counts `skipped_steps` from now (call at the start of each epoch)."""
        counter = self._counter()
        if counter is None:
            return
        if self._skipped_at_epoch_start is None:
            self._skipped_at_epoch_start = keras.Variable(
                0, dtype="int64", trainable=False, name="autoprec_skipped_at_epoch_start"
            )
        self._skipped_at_epoch_start.assign(keras.ops.cast(counter, "int64"))

    def _counter(self):
        return getattr(getattr(self.model, "optimizer", None), "non_finite_steps", None)

    def _wrap(self, original: Callable) -> Callable:
        logs_keeper = self

        @functools.wraps(original)
        def train_step(*args, **kwargs):
            if not logs_keeper.active:
                return original(*args, **kwargs)
            return logs_keeper._finite_step(original, *args, **kwargs)

        return train_step

    def _finite_step(self, original: Callable, *args, **kwargs):
        variables = list(self.model.metrics_variables)
        before = [keras.ops.copy(variable.value) for variable in variables]
        logs = original(*args, **kwargs)
        if not isinstance(logs, dict) or "loss" not in logs:
            return logs
        finite = keras.ops.all(keras.ops.isfinite(keras.ops.convert_to_tensor(logs["loss"])))
        finite = instrument_backend().every_replica(finite)
        for variable, value in zip(variables, before):
            variable.assign(keras.ops.where(finite, variable.value, value))
        logs = dict(self.model.get_metrics_result())
        counter, start = self._counter(), self._skipped_at_epoch_start
        if counter is not None and start is not None:
            logs[SKIPPED_STEPS] = keras.ops.cast(counter, "int64") - start.value
        return logs
