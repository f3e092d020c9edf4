"""Per-layer amax telemetry inside the compiled train step: what the guard reads when a step fails."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np
from keras import ops

from .._backends import telemetry_backend
from .._backends.amax import amax_bits, bit_view, bits_to_float, is_float_tensor
from .._core.dtypes import FLOAT16, FLOAT32
from .._core.models import swap_attribute
from ..layers import (
    PASS_THROUGH_CLASSES,
    is_graph_model,
    is_pass_through,
    layer_paths,
    observing_attention,
)
from .step_trace import StepTrace, active_trace, build_frame, close_trace, open_trace
from .telemetry_records import (
    FORMAT_MAX,
    GRADIENT,
    INPUT,
    INTERNAL,
    NOT_RECORDED,
    OUTPUT,
    SLOTS,
    LayerAmax,
    StepRecord,
    TelemetryStatus,
    format_max,
    is_out_of_range,
    status_flags,
    step_record,
)

__all__ = [
    "BOUNDED_PASS_THROUGH",
    "FORMAT_MAX",
    "GRADIENT",
    "INPUT",
    "INTERNAL",
    "NOT_RECORDED",
    "OUTPUT",
    "SLOTS",
    "GuardTelemetry",
    "LayerAmax",
    "StepRecord",
    "TelemetryStatus",
    "amax_bits",
    "bit_view",
    "bits_to_float",
    "format_max",
    "is_out_of_range",
    "telemetry_paths",
]

#: Pass-through layers whose outputs are never larger in magnitude than their
#: inputs (the dropout and noise layers scale or add, and are left out).
BOUNDED_PASS_THROUGH = frozenset(
    name
    for name in PASS_THROUGH_CLASSES
    if "Dropout" not in name and name not in ("GaussianNoise", "InputLayer")
)

# Attributes Keras hangs on tensors that an observed output must carry on.
_KERAS_TENSOR_ATTRIBUTES = ("_keras_mask", "_keras_logits")
# The telemetry installed on each model (by id), so that installing another removes it.
_INSTALLED: weakref.WeakValueDictionary[int, GuardTelemetry] = weakref.WeakValueDictionary()


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
    """Returns the paths of the layers the telemetry records: 16-bit layers that compute."""
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
        backend = telemetry_backend("the autoprec guard's telemetry")
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
        self.hooks.install_step(self.model, self, self._weight_owners(paths), self._replace)
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

    def measure(self, trace: StepTrace, tensor: Any) -> Any:
        """Returns the amax bits of `tensor` as the step measures them (not kept for reuse)."""
        return amax_bits(tensor, trace.integer)

    def gradients_finite(self, trace: StepTrace) -> Any:
        """Returns whether every gradient the optimizer received in the step is finite (traced)."""
        return trace.gradients_finite()

    def record_activation_gradient(self, trace: StepTrace, index: int, bits: Any) -> None:
        """Records the amax bits of the gradient flowing into recorded layer `index`."""
        trace.add(index, GRADIENT, bits)

    def take_forward_values(self, trace: StepTrace) -> tuple[Any, list[int]]:
        """Returns `(stacked bits, frame segments)` recorded so far, and forgets them."""
        return trace.take_values()

    def frame(self, trace: StepTrace, scale: Any, extra: tuple[Any, list[int]] | None = None):
        """Returns the step's frame (see `step_trace.build_frame`)."""
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
            lazy = telemetry._lazy(index)
            for value in keras.tree.flatten((args, kwargs)):
                if not is_float_tensor(value):
                    continue
                if lazy:
                    trace.add_lazy(index, INPUT, trace.lazy_parts(value))
                else:
                    trace.add(index, INPUT, trace.amax(value))
            outputs = original(*args, **kwargs)
            return telemetry._observe(trace, index, outputs)

        return call

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
        observed = []
        for value in flat:
            if not is_float_tensor(value):
                observed.append(value)
                continue
            result = self.hooks.watch_gradient(self, trace, index, value)
            trace.add(index, OUTPUT, trace.amax(result))
            _copy_keras_attributes(value, result)
            observed.append(result)
        if len(flat) == 1 and not isinstance(outputs, (list, tuple, dict)):
            return observed[0]
        return keras.tree.pack_sequence_as(outputs, observed)

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
