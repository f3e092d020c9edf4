"""JAX side of the profiler's probes: one tensor's raw statistics, their totals on the host, and how
one traced train step's measurements leave it through sinks."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import ProfileError
from .instrument import (
    BIASED_EXPONENT_BINS,
    FLOAT32_EXPONENT_BIAS,
    FLOAT_SLOTS,
    INFINITY_BITS,
    MANTISSA_BITS,
    RAW_COUNT_SLOTS,
    SMALLEST_NORMAL_BITS,
    Slot,
    empty_totals,
)

_NONFINITE_BIN = BIASED_EXPONENT_BINS - 1
_NAN_SLOT = RAW_COUNT_SLOTS - 1

#: Order of the float32 values one measurement returns: the sums are of values
#: divided by `2**scale_exponent`.
STEP_FLOAT_SLOTS = (*FLOAT_SLOTS, "scale_exponent")


def _power_of_two(exponent: jax.Array) -> jax.Array:
    """`2.0**exponent` in float32, exactly, for integer exponents in [-126, 127] (built from bits)."""
    biased = (exponent.astype(jnp.int32) + FLOAT32_EXPONENT_BIAS) << MANTISSA_BITS
    return lax.bitcast_convert_type(biased, jnp.float32)


def _flat_statistics(flat: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Raw statistics of a 1-D float32 array: int32 counts and float32 `STEP_FLOAT_SLOTS`."""
    magnitude = jnp.abs(flat)
    bits = lax.bitcast_convert_type(magnitude, jnp.int32)
    # A subnormal |x| is m * 2^-149 with integer m < 2^23: floor(log2(m)) is the
    # biased exponent of float32(m) (exact) minus the bias.
    is_subnormal = (bits > 0) & (bits < SMALLEST_NORMAL_BITS)
    mantissa_exponent = (
        lax.bitcast_convert_type(bits.astype(jnp.float32), jnp.int32) >> MANTISSA_BITS
    ) - FLOAT32_EXPONENT_BIAS
    slots = jnp.where(
        is_subnormal,
        BIASED_EXPONENT_BINS + mantissa_exponent,
        jnp.where(bits > INFINITY_BITS, _NAN_SLOT, bits >> MANTISSA_BITS),
    )
    counts = jnp.zeros((RAW_COUNT_SLOTS,), jnp.int32).at[slots].add(1, mode="promise_in_bounds")
    counts = counts.at[_NONFINITE_BIN].add(counts[_NAN_SLOT])  # slot 255 counts inf and NaN
    finite = jnp.where(bits < INFINITY_BITS, magnitude, jnp.float32(0.0))
    # Zeros wrap to the largest unsigned value, so the minimum is the smallest non-zero.
    shifted_bits = lax.bitcast_convert_type(bits, jnp.uint32) - jnp.uint32(1)
    largest, smallest_shifted = lax.reduce(
        (finite, shifted_bits),
        (np.float32(0.0), np.uint32(0xFFFFFFFF)),
        lambda a, b: (jnp.maximum(a[0], b[0]), jnp.minimum(a[1], b[1])),
        (0,),
    )
    smallest_bits = smallest_shifted + jnp.uint32(1)
    min_nonzero = jnp.where(
        (smallest_bits > 0) & (smallest_bits < INFINITY_BITS),
        lax.bitcast_convert_type(smallest_bits, jnp.float32),
        jnp.float32(np.inf),
    )
    exponent = jnp.where(
        largest > 0,
        (lax.bitcast_convert_type(largest, jnp.int32) >> MANTISSA_BITS) - FLOAT32_EXPONENT_BIAS,
        0,
    )
    # Two exact power-of-two factors applied one after the other: each is a normal
    # float32 whatever the exponent (their product may not be).
    half = exponent // 2
    scaled = finite * _power_of_two(-half) * _power_of_two(half - exponent)
    sum_abs, sum_squares = lax.reduce(
        (scaled, scaled * scaled),
        (np.float32(0.0), np.float32(0.0)),
        lambda a, b: (a[0] + b[0], a[1] + b[1]),
        (0,),
    )
    floats = jnp.stack([largest, min_nonzero, sum_abs, sum_squares, exponent.astype(jnp.float32)])
    return counts, floats


def tensor_statistics(tensor: Any, multiplier: Any = None) -> tuple[jax.Array, jax.Array]:
    """Computes one tensor's raw statistics, inside a traced step or eagerly."""
    flat = jnp.ravel(lax.stop_gradient(jnp.asarray(tensor))).astype(jnp.float32)
    if multiplier is not None:
        flat = flat * jnp.asarray(multiplier, jnp.float32)
    return _flat_statistics(flat)


def host_statistics(counts: np.ndarray, floats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Adds up measurements (rows of `tensor_statistics`) into int64 counts and float64 floats."""
    counts = np.asarray(counts, np.int64).reshape(-1, RAW_COUNT_SLOTS)
    floats = np.asarray(floats, np.float64).reshape(-1, len(STEP_FLOAT_SLOTS))
    live = counts.sum(axis=1) > 0
    total = counts.sum(axis=0)
    floats = floats[live]
    if not floats.shape[0]:
        return total, empty_totals()[1]
    scale = np.exp2(floats[:, 4])
    return total, np.array(
        [
            floats[:, 0].max(),
            floats[:, 1].min(),
            float(np.sum(floats[:, 2] * scale)),
            float(np.sum(floats[:, 3] * scale * scale)),
        ]
    )


_WORDS = RAW_COUNT_SLOTS + len(STEP_FLOAT_SLOTS)
_DIGIT_SHIFTS = (0, 8, 16, 24)
#: Length of a sink: every 32-bit word of one measurement as four base-256 digits.
SINK_SIZE = _WORDS * len(_DIGIT_SHIFTS)


def encode(counts: jax.Array, floats: jax.Array) -> jax.Array:
    """Writes one measurement as float32 base-256 digits, exact under any add or matmul precision."""
    words = jnp.concatenate(
        [
            lax.bitcast_convert_type(counts.astype(jnp.int32), jnp.uint32),
            lax.bitcast_convert_type(floats.astype(jnp.float32), jnp.uint32),
        ]
    )
    shifts = jnp.asarray(_DIGIT_SHIFTS, jnp.uint32)
    digits = (words[:, None] >> shifts[None, :]) & jnp.uint32(0xFF)
    return digits.astype(jnp.float32).reshape(-1)


def decode(encoded: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Reads back the measurement that `encode` wrote."""
    digits = jnp.round(encoded).astype(jnp.uint32).reshape(_WORDS, len(_DIGIT_SHIFTS))
    shifts = jnp.asarray(_DIGIT_SHIFTS, jnp.uint32)
    words = jnp.sum(digits << shifts[None, :], axis=1, dtype=jnp.uint32)  # disjoint bits
    counts = lax.bitcast_convert_type(words[:RAW_COUNT_SLOTS], jnp.int32)
    floats = lax.bitcast_convert_type(words[RAW_COUNT_SLOTS:], jnp.float32)
    return counts, floats


@jax.custom_vjp
def observe(value: jax.Array, sink: jax.Array, multiplier: jax.Array) -> jax.Array:
    """Returns `value`, through an identity whose gradient rule measures the gradient flowing back."""
    del sink, multiplier
    return value


def _observe_forward(value, sink, multiplier):
    del sink
    return value, multiplier


def _observe_backward(multiplier, gradient):
    counts, floats = tensor_statistics(gradient, multiplier)
    return gradient, encode(counts, floats), jnp.zeros_like(multiplier)


observe.defvjp(_observe_forward, _observe_backward)


@dataclasses.dataclass
class StepTrace:
    """What one trace of the wrapped train step has recorded so far (trace-time Python state)."""

    discovering: bool
    multiplier: Any
    forward_sites: list[Slot] = dataclasses.field(default_factory=list)
    backward_sites: list[Slot] = dataclasses.field(default_factory=list)
    trainable_count: int = 0
    in_loss: bool = False
    forward_sinks: list[Any] = dataclasses.field(default_factory=list)
    backward_sinks: list[Any] = dataclasses.field(default_factory=list)
    forward_used: int = 0
    backward_used: int = 0
    loss_terms: list[Any] = dataclasses.field(default_factory=list)
    direct: list[tuple[Slot, Any, Any]] = dataclasses.field(default_factory=list)
    sink_gradients: list[Any] | None = None

    @property
    def sink_count(self) -> int:
        """Number of sinks the step differentiates: one per probe of the abstract pass."""
        return len(self.forward_sites) + len(self.backward_sites)

    # -- the sinks in the trainable list

    def with_sinks(self, trainable: list) -> list:
        """Returns `trainable` with a zero sink per probe, right after the model's own values."""
        sinks = [jnp.zeros((SINK_SIZE,), jnp.float32) for _ in range(self.sink_count)]
        count = self.trainable_count
        # Right after the model's own values: another wrapper's extra entries stay last.
        return [*trainable[:count], *sinks, *trainable[count:]]

    def take_sinks(self, trainable: list) -> list:
        """Takes the sinks off the loss function's trainable values (kept for the probes)."""
        count, end = self.trainable_count, self.trainable_count + self.sink_count
        if len(trainable) < end:
            raise ProfileError(
                "autoprec profiling on JAX: compute_loss_and_updates received "
                f"{len(trainable)} trainable values, fewer than the {end} the probed "
                "train step passed; a custom train_step must differentiate "
                "compute_loss_and_updates with respect to the trainable values it is "
                "given, as Keras' own does."
            )
        sinks = trainable[count:end]
        self.forward_sinks = sinks[: len(self.forward_sites)]
        self.backward_sinks = sinks[len(self.forward_sites) :]
        return [*trainable[:count], *trainable[end:]]

    def take_sink_gradients(self, grads: list, trainable: list) -> tuple[list, list]:
        """Takes the sinks and their gradients (kept for `statistics`) off the optimizer's lists."""
        count, end = self.trainable_count, self.trainable_count + self.sink_count
        if self.sink_count and len(grads) >= end:
            self.sink_gradients = grads[count:end]
            grads = [*grads[:count], *grads[end:]]
            trainable = [*trainable[:count], *trainable[end:]]
        return grads, trainable

    def next_sink(self, backward: bool, slot: Slot) -> Any:
        """Returns the next sink of that kind, checking the probe is the one the abstract pass saw."""
        kind = "backward" if backward else "forward"
        sites, sinks = getattr(self, f"{kind}_sites"), getattr(self, f"{kind}_sinks")
        used = getattr(self, f"{kind}_used")
        if used >= len(sinks) or sites[used] != slot:
            expected = sites[used] if used < len(sites) else "no more probes"
            raise ProfileError(
                f"autoprec profiling on JAX: the train step probed {slot} where its abstract "
                f"pass probed {expected}; the model's forward pass must trace the same way "
                "twice (no Python state that changes between traces)."
            )
        setattr(self, f"{kind}_used", used + 1)
        return sinks[used]

    # -- recording

    def measure(self, slot: Slot, tensor: Any, multiplier: Any = None) -> None:
        """Measures a value outside the differentiated function (not while discovering)."""
        if not self.discovering:
            self.direct.append((slot, *tensor_statistics(tensor, multiplier)))

    def record(self, slot: Slot, tensor: Any) -> None:
        """Records a forward value: through its sink inside the loss function, directly outside it."""
        if self.discovering:
            if self.in_loss:
                self.forward_sites.append(slot)
            return
        if not self.in_loss:
            self.measure(slot, tensor)
            return
        counts, floats = tensor_statistics(tensor)
        sink = self.next_sink(False, slot)
        self.loss_terms.append(jnp.sum(sink * lax.stop_gradient(encode(counts, floats))))

    def observe_gradient(self, slot: Slot, tensor: Any) -> Any:
        """Returns `tensor`, through `observe` with its sink when inside the loss function."""
        if not self.in_loss:  # no gradient is taken outside the loss function
            return tensor
        if self.discovering:
            self.backward_sites.append(slot)
            return tensor
        sink = self.next_sink(True, slot)
        multiplier = jnp.float32(1.0) if self.multiplier is None else self.multiplier
        return observe(tensor, sink, multiplier)

    def add_loss_terms(self, loss: Any) -> Any:
        """Returns `loss` plus the forward values' terms (each an exact 0.0 carrying digits)."""
        if not self.loss_terms:
            return loss
        loss = loss + functools.reduce(jnp.add, self.loss_terms)
        self.loss_terms = []
        return loss

    def statistics(self) -> dict[Slot, tuple[jax.Array, jax.Array]]:
        """Returns the step's measurements by slot, as `[calls, ...]` stacks of counts and floats."""
        if self.forward_used + self.backward_used != self.sink_count:  # neither passes its sites
            raise ProfileError(
                "autoprec profiling on JAX: the train step probed fewer tensors than its "
                "abstract pass; the model's forward pass must trace the same way twice."
            )
        rows = list(self.direct)
        if self.sink_count:
            if self.sink_gradients is None or len(self.sink_gradients) != self.sink_count:
                raise ProfileError(
                    "autoprec profiling on JAX: the optimizer's stateless_apply did not receive "
                    "the gradients of the profiler's sinks; a custom train_step must pass the "
                    "gradients of every trainable value it differentiated to stateless_apply."
                )
            sites = [*self.forward_sites, *self.backward_sites]
            rows += [(slot, *decode(grad)) for slot, grad in zip(sites, self.sink_gradients)]
        grouped: dict[Slot, list] = {}
        for slot, *measured in rows:
            grouped.setdefault(slot, []).append(measured)
        return {slot: tuple(map(jnp.stack, zip(*measured))) for slot, measured in grouped.items()}
