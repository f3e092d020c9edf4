"""The amax bits one traced train step records, and the frame they are reduced to."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from keras import ops

from .._backends.amax import (
    FLOAT32_INFINITY_BITS,
    amax_bits,
    bit_view,
    bits_to_float,
    is_float_tensor,
)
from .telemetry_records import (
    HEADER_BATCH_AMAX,
    HEADER_GRADIENTS_BAD,
    HEADER_LOSS_SCALE,
    NOT_RECORDED_BITS,
    SLOTS,
    frame_segment,
)

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
