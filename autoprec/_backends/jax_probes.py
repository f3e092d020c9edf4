"""JAX side of the profiler: statistics measured inside the pure train step and returned with its logs.

The profiler (backend neutral) decides *what* to record; this module records
it inside Keras' JAX train step, a pure function that cannot update a
variable from inside. Every value leaves the compiled step as an output, so
nothing waits on a host callback and the step runs as one SPMD program on
several devices (a `keras.distribution` shards the batch; every reduction
below is then over the whole batch):

- **forward values** (layer outputs, attention logits) are measured inside the
  differentiated loss function, where they cannot be returned directly. Each
  one's statistics, written as base-256 digits (exact small integers in
  float32), are multiplied by a zero-valued *sink* input and added to the
  loss: the loss does not change (it gains an exact `0.0`) and the gradient
  with respect to the sink is the digits themselves;
- **activation gradients** pass through a `jax.custom_vjp` identity whose
  backward rule measures the incoming gradient and returns its digits as the
  gradient of another sink;
- **weights and weight gradients** are measured in the wrapped
  `optimizer.stateless_apply`, outside the differentiated function.

The sinks travel as extra entries of the trainable list the train step
differentiates, right after the model's own values (so the guard telemetry's
carrier, which another wrapper appends last, stays last whichever wraps the
other); the wrapped `compute_loss_and_updates` and `stateless_apply` take
exactly those entries off before Keras sees them. How many sinks a step needs
is known only once its forward pass is traced, so before the first step of
each batch signature the wrapped train function runs the model's forward
pass abstractly (`jax.eval_shape` of `model.stateless_call`: nothing is
computed or emitted, and no train step is active, so no other wrapper records
anything), which lists the probes in call order; the traced step then has one
sink per probe.
The step's statistics come back in its logs under one key that the wrapped
train function takes out before `fit` sees the logs; that wrapper feeds the
train step one batch at a time, so with `steps_per_execution > 1` every
step's statistics are kept. The host adds the steps up in int64/float64.

**How a tensor is measured** gives the TensorFlow module's numbers (its XLA
path) in fewer kernels: the float32 bit pattern of `|x|` shifted right by 23
bits gives the biased exponent (0: zero, 255: inf or NaN), a subnormal's
exact exponent comes from its mantissa, and one scatter-add counts both and
the NaNs; the smallest non-zero magnitude is the minimum of `bits - 1` taken
as unsigned; the sums are taken over finite values rescaled by the power of
two of the largest (the exponent is returned, and the host scales back in
float64, since JAX computes in float32 by default).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax import lax

from ..errors import BackendError, ProfileError
from .probe_hooks import Replace, Slot, WeightOwners

_MANTISSA_BITS = 23
_BIASED_EXPONENT_BINS = 256
_SUBNORMAL_EXPONENTS = 23
_SMALLEST_NORMAL_BITS = 1 << _MANTISSA_BITS
_INFINITY_BITS = 0x7F800000
_FLOAT32_EXPONENT_BIAS = 127
_NONFINITE_BIN = 255
_NAN_SLOT = 279

#: Length of the raw count vector, as on TensorFlow: 256 biased-exponent slots
#: (slot 0 the zeros, slot 255 the non-finite values), 23 float32 subnormal
#: exponents (-149 .. -127), then the NaNs among the non-finite values.
RAW_COUNT_SLOTS = _BIASED_EXPONENT_BINS + _SUBNORMAL_EXPONENTS + 1
#: Order of the float32 values one measurement returns: the sums are of values
#: divided by `2**scale_exponent`.
STEP_FLOAT_SLOTS = ("max_abs", "min_nonzero_abs", "sum_abs", "sum_squares", "scale_exponent")

_WORDS = RAW_COUNT_SLOTS + len(STEP_FLOAT_SLOTS)
_DIGIT_SHIFTS = (0, 8, 16, 24)
#: Length of a sink: every 32-bit word of one measurement as four base-256 digits.
SINK_SIZE = _WORDS * len(_DIGIT_SHIFTS)

#: The logs key under which a probed train step returns its statistics.
LOGS_KEY = "_autoprec_probe_statistics"
#: Steps kept on the device before the host folds them into its totals.
_PENDING_STEPS = 32


def _power_of_two(exponent: jax.Array) -> jax.Array:
    """`2.0**exponent` in float32, exactly, for integer exponents in [-126, 127] (built from bits)."""
    biased = (exponent.astype(jnp.int32) + _FLOAT32_EXPONENT_BIAS) << _MANTISSA_BITS
    return lax.bitcast_convert_type(biased, jnp.float32)


def _flat_statistics(flat: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Raw statistics of a 1-D float32 array: int32 counts and float32 `STEP_FLOAT_SLOTS`.

    Three passes, each one XLA kernel: one scatter-add counts every slot at
    once (the exponents, the exact subnormal exponents, the NaNs), one
    variadic reduction gives the largest finite magnitude and the smallest
    non-zero bit pattern, one more the rescaled sums. Fewer kernels than
    separate reductions keep the compile time of a probed step down.
    """
    magnitude = jnp.abs(flat)
    bits = lax.bitcast_convert_type(magnitude, jnp.int32)
    # A subnormal |x| is m * 2^-149 with integer m < 2^23: floor(log2(m)) is the
    # biased exponent of float32(m) (exact) minus the bias.
    is_subnormal = (bits > 0) & (bits < _SMALLEST_NORMAL_BITS)
    mantissa_exponent = (
        lax.bitcast_convert_type(bits.astype(jnp.float32), jnp.int32) >> _MANTISSA_BITS
    ) - _FLOAT32_EXPONENT_BIAS
    slots = jnp.where(
        is_subnormal,
        _BIASED_EXPONENT_BINS + mantissa_exponent,
        jnp.where(bits > _INFINITY_BITS, _NAN_SLOT, bits >> _MANTISSA_BITS),
    )
    counts = jnp.zeros((RAW_COUNT_SLOTS,), jnp.int32).at[slots].add(1, mode="promise_in_bounds")
    counts = counts.at[_NONFINITE_BIN].add(counts[_NAN_SLOT])  # slot 255 counts inf and NaN
    finite = jnp.where(bits < _INFINITY_BITS, magnitude, jnp.float32(0.0))
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
        (smallest_bits > 0) & (smallest_bits < _INFINITY_BITS),
        lax.bitcast_convert_type(smallest_bits, jnp.float32),
        jnp.float32(np.inf),
    )
    exponent = jnp.where(
        largest > 0,
        (lax.bitcast_convert_type(largest, jnp.int32) >> _MANTISSA_BITS) - _FLOAT32_EXPONENT_BIAS,
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
    """Computes one tensor's raw statistics, inside a traced step or eagerly.

    Args:
        tensor: any floating-point array; measured in float32.
        multiplier: optional float32 scalar applied first (to undo a loss scale).

    Returns:
        `(counts, floats)`: int32 `[RAW_COUNT_SLOTS]` counts and float32 values in
        `STEP_FLOAT_SLOTS` order (`host_statistics` turns rows of them into totals).

    Example:

    ```python
    counts, floats = tensor_statistics(jnp.array([0.5, -3.0, 0.0]))
    ```
    """
    flat = jnp.ravel(lax.stop_gradient(jnp.asarray(tensor))).astype(jnp.float32)
    if multiplier is not None:
        flat = flat * jnp.asarray(multiplier, jnp.float32)
    return _flat_statistics(flat)


def host_statistics(counts: np.ndarray, floats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Adds up measurements (rows of `tensor_statistics`) into int64 counts and float64 floats.

    Rows that measured nothing (a gradient that never flowed) are left out.

    Args:
        counts: `[rows, RAW_COUNT_SLOTS]` integer counts.
        floats: `[rows, 5]` float32 values in `STEP_FLOAT_SLOTS` order.

    Returns:
        `(counts, floats)` as `autoprec.profiler.TensorStats.from_raw` takes them:
        int64 `[RAW_COUNT_SLOTS]` and float64 `[max, min non-zero, sum |x|, sum x^2]`.

    Example:

    ```python
    counts, floats = host_statistics(*jax.device_get(tensor_statistics(x)))
    ```
    """
    counts = np.asarray(counts, np.int64).reshape(-1, RAW_COUNT_SLOTS)
    floats = np.asarray(floats, np.float64).reshape(-1, len(STEP_FLOAT_SLOTS))
    live = counts.sum(axis=1) > 0
    total = counts.sum(axis=0)
    floats = floats[live]
    if not floats.shape[0]:
        return total, np.array([0.0, np.inf, 0.0, 0.0])
    scale = np.exp2(floats[:, 4])
    return total, np.array(
        [
            floats[:, 0].max(),
            floats[:, 1].min(),
            float(np.sum(floats[:, 2] * scale)),
            float(np.sum(floats[:, 3] * scale * scale)),
        ]
    )


def _encode(counts: jax.Array, floats: jax.Array) -> jax.Array:
    """One measurement as base-256 digits in float32: exact under any add or matmul precision."""
    words = jnp.concatenate(
        [
            lax.bitcast_convert_type(counts.astype(jnp.int32), jnp.uint32),
            lax.bitcast_convert_type(floats.astype(jnp.float32), jnp.uint32),
        ]
    )
    shifts = jnp.asarray(_DIGIT_SHIFTS, jnp.uint32)
    digits = (words[:, None] >> shifts[None, :]) & jnp.uint32(0xFF)
    return digits.astype(jnp.float32).reshape(-1)


def _decode(encoded: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The measurement `_encode` wrote (all zeros, a count of 0, where no gradient flowed)."""
    digits = jnp.round(encoded).astype(jnp.uint32).reshape(_WORDS, len(_DIGIT_SHIFTS))
    shifts = jnp.asarray(_DIGIT_SHIFTS, jnp.uint32)
    words = jnp.sum(digits << shifts[None, :], axis=1, dtype=jnp.uint32)  # disjoint bits
    counts = lax.bitcast_convert_type(words[:RAW_COUNT_SLOTS], jnp.int32)
    floats = lax.bitcast_convert_type(words[RAW_COUNT_SLOTS:], jnp.float32)
    return counts, floats


@jax.custom_vjp
def _observe(value: jax.Array, sink: jax.Array, multiplier: jax.Array) -> jax.Array:
    """The identity on `value`; its backward rule returns the gradient's digits as `sink`'s."""
    del sink, multiplier
    return value


def _observe_forward(value, sink, multiplier):
    del sink
    return value, multiplier


def _observe_backward(multiplier, gradient):
    counts, floats = tensor_statistics(gradient, multiplier)
    return gradient, _encode(counts, floats), jnp.zeros_like(multiplier)


_observe.defvjp(_observe_forward, _observe_backward)


@dataclasses.dataclass
class _StepTrace:
    """What one trace of the wrapped train step has recorded so far (trace-time Python state).

    In the abstract pass (`discovering`) the probes only list their slots in
    call order; in the real pass they consume the sinks in the same order.
    """

    discovering: bool
    multiplier: Any
    forward_sites: list[Slot] = dataclasses.field(default_factory=list)
    backward_sites: list[Slot] = dataclasses.field(default_factory=list)
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
        return len(self.forward_sites) + len(self.backward_sites)

    def next_sink(self, backward: bool, slot: Slot) -> Any:
        """Returns the next sink of that kind, checking the probe is the one the abstract pass saw."""
        sites, sinks = (
            (self.backward_sites, self.backward_sinks)
            if backward
            else (self.forward_sites, self.forward_sinks)
        )
        used = self.backward_used if backward else self.forward_used
        if used >= len(sinks) or sites[used] != slot:
            expected = sites[used] if used < len(sites) else "no more probes"
            raise ProfileError(
                f"autoprec profiling on JAX: the train step probed {slot} where its abstract "
                f"pass probed {expected}; the model's forward pass must trace the same way "
                "twice (no Python state that changes between traces)."
            )
        if backward:
            self.backward_used += 1
        else:
            self.forward_used += 1
        return sinks[used]


def _signature(data: Any) -> Any:
    """The structure, shapes and dtypes of a batch: what a traced step depends on."""
    leaves, structure = jax.tree_util.tree_flatten(data)
    return structure, tuple(
        (tuple(getattr(leaf, "shape", ())), str(getattr(leaf, "dtype", type(leaf).__name__)))
        for leaf in leaves
    )


def _takes_training(model: keras.Model) -> bool:
    """Whether the model's `call` takes `training` (the loss function passes it then)."""
    try:
        parameters = inspect.signature(model.call).parameters
    except (TypeError, ValueError):
        return False
    return "training" in parameters or any(
        parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values()
    )


def _inverse_loss_scale(optimizer: Any, optimizer_variables: list) -> jax.Array | None:
    """`1 / loss scale` the step uses, read from the step's own optimizer state, or `None`."""
    is_loss_scale_optimizer = hasattr(optimizer, "inner_optimizer")
    if not is_loss_scale_optimizer and getattr(optimizer, "loss_scale_factor", None) is None:
        return None
    mapping = list(zip(optimizer.variables, optimizer_variables))
    with keras.StatelessScope(state_mapping=mapping):
        scale = optimizer.scale_loss(jnp.float32(1.0))
    return jnp.float32(1.0) / jnp.asarray(scale, jnp.float32)


class ProbeHooks:
    """The profiler's step hooks on JAX: statistics returned with each pure train step's logs.

    The `autoprec._backends.probe_hooks.ProbeHooks` interface (see the module
    docstring for how the values leave the step). Wraps, on the instances,
    the model's `train_step`, `compute_loss_and_updates` and
    `make_train_function` and the optimizer's `stateless_apply`.

    Args:
        xla: unused (JAX always compiles with XLA); kept for the common interface.

    Example:

    ```python
    hooks = ProbeHooks()
    hooks.install_step(model, {id(model.layers[0].kernel): ("dense", "kernel")}, replace)
    ```
    """

    def __init__(self, xla: bool = True) -> None:
        del xla
        self._trace: _StepTrace | None = None
        self._slots: dict[Slot, None] = {}
        self._pending: list[dict] = []
        self._totals: dict[Slot, tuple[np.ndarray, np.ndarray]] = {}
        self._steps = 0
        self._trainable_count = 0
        self._layouts: dict[Any, tuple[list[Slot], list[Slot]]] = {}

    @property
    def recording(self) -> bool:
        """Whether the wrapped train step is being traced now."""
        return self._trace is not None

    @property
    def tensor_count(self) -> int:
        """Number of slots seen so far."""
        return len(self._slots)

    # -- installing

    def install_step(self, model: keras.Model, owners: WeightOwners, replace: Replace) -> None:
        """Wraps the train step, the loss function, the train function's builder and `stateless_apply`."""
        trainable = list(model.trainable_variables)
        self._trainable_count = len(trainable)
        positions = {
            position: owners[id(variable)]
            for position, variable in enumerate(trainable)
            if id(variable) in owners
        }
        optimizer = model.optimizer
        replace(model, "train_step", self._wrap_train_step(model, optimizer, model.train_step))
        replace(model, "compute_loss_and_updates", self._wrap_loss(model.compute_loss_and_updates))
        replace(model, "make_train_function", self._wrap_make(model, model.make_train_function))
        replace(
            optimizer, "stateless_apply", self._wrap_apply(optimizer.stateless_apply, positions)
        )

    def rebuild_train_function(self, model: keras.Model) -> None:
        """Rebuilds the train function; inside `fit`, first puts the step's state back in the variables.

        Between two steps `fit` keeps the state outside the variables, and under
        a `keras.distribution` building the train function reads each variable's
        sharding; `jax_state_sync()` (Keras' way for a callback to reach the
        state) puts it back, and `fit` takes it up again at the next step.
        """
        model.jax_state_sync()
        model.make_train_function(force=True)

    def _wrap_make(self, model: keras.Model, original: Callable) -> Callable:
        hooks = self

        @functools.wraps(original)
        def make_train_function(force: bool = False):
            result = original(force=force)
            function = model.train_function
            if function is not None and not getattr(function, "_autoprec_probed", False):
                model.train_function = hooks._wrap_train_function(model, function)
            return result

        return make_train_function

    def _wrap_train_function(self, model: keras.Model, original: Callable) -> Callable:
        """Feeds Keras' step function one batch at a time and takes each step's statistics out."""
        steps_per_execution = max(1, int(getattr(model, "steps_per_execution", 1) or 1))

        def step(state, batch):
            self._ensure_layout(model, state, batch)
            logs, state = original(state, iter((batch,)))
            return self._take(logs), state

        def train_function(state, iterator):
            logs, state = step(state, next(iterator))
            for _ in range(steps_per_execution - 1):
                try:
                    batch = next(iterator)
                except StopIteration:
                    break
                logs, state = step(state, batch)
            return logs, state

        train_function._autoprec_probed = True
        return train_function

    def _take(self, logs: Any) -> Any:
        if not isinstance(logs, dict) or LOGS_KEY not in logs:
            return logs
        logs = dict(logs)
        self._pending.append(logs.pop(LOGS_KEY))
        self._steps += 1
        if len(self._pending) >= _PENDING_STEPS:
            self._fold()
        return logs

    def _wrap_train_step(self, model: keras.Model, optimizer: Any, original: Callable) -> Callable:
        hooks = self

        @functools.wraps(original)
        def train_step(state, data):
            if hooks._trace is not None:  # a nested call: record once, in the outer step
                return original(state, data)
            trainable, non_trainable, optimizer_variables, metrics = state
            forward_sites, backward_sites = hooks._ensure_layout(model, state, data)
            trace = _StepTrace(
                discovering=False,
                multiplier=_inverse_loss_scale(optimizer, optimizer_variables),
                forward_sites=forward_sites,
                backward_sites=backward_sites,
            )
            sinks = [jnp.zeros((SINK_SIZE,), jnp.float32) for _ in range(trace.sink_count)]
            # Right after the model's own values: another wrapper's extra entries stay last.
            count = hooks._trainable_count
            trainable = [*trainable[:count], *sinks, *trainable[count:]]
            hooks._trace = trace
            try:
                logs, state = original(
                    (trainable, non_trainable, optimizer_variables, metrics), data
                )
            finally:
                hooks._trace = None
            return {**logs, LOGS_KEY: hooks._step_statistics(trace)}, state

        return train_step

    def _ensure_layout(
        self, model: keras.Model, state: Any, data: Any
    ) -> tuple[list[Slot], list[Slot]]:
        """The probes of the forward pass for batches like `data`, in call order.

        Found by running the model's forward pass abstractly (`jax.eval_shape`
        of `model.stateless_call`, as the loss function calls it: nothing is
        computed or emitted), once per batch signature. The wrapped train
        function asks before each jitted step, while no train step is active,
        so no other wrapper of the train step, the optimizer or the layers
        records anything in this pass; the traced step finds the answer here.
        """
        key = _signature(data)
        if key in self._layouts:
            return self._layouts[key]
        trainable, non_trainable = list(state[0]), list(state[1])
        inputs, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        kwargs = {"training": True} if _takes_training(model) else {}

        def forward(trainable_values, non_trainable_values, inputs):
            outputs, _ = model.stateless_call(
                trainable_values, non_trainable_values, inputs, **kwargs
            )
            return outputs

        outer, self._trace = self._trace, _StepTrace(discovering=True, multiplier=None)
        self._trace.in_loss = True
        try:
            jax.eval_shape(
                forward,
                trainable[: self._trainable_count],
                non_trainable[: len(model.non_trainable_variables)],
                inputs,
            )
            discovery = self._trace
        finally:
            self._trace = outer
        self._layouts[key] = (discovery.forward_sites, discovery.backward_sites)
        return self._layouts[key]

    def _wrap_loss(self, original: Callable) -> Callable:
        hooks = self

        @functools.wraps(original)
        def compute_loss_and_updates(trainable_variables, *args, **kwargs):
            trace = hooks._trace
            if trace is None:
                return original(trainable_variables, *args, **kwargs)
            trainable = list(trainable_variables)
            if not trace.discovering:
                count, end = hooks._trainable_count, hooks._trainable_count + trace.sink_count
                if len(trainable) < end:
                    raise ProfileError(
                        "autoprec profiling on JAX: compute_loss_and_updates received "
                        f"{len(trainable)} trainable values, fewer than the {end} the probed "
                        "train step passed; a custom train_step must differentiate "
                        "compute_loss_and_updates with respect to the trainable values it is "
                        "given, as Keras' own does."
                    )
                sinks = trainable[count:end]
                trainable = [*trainable[:count], *trainable[end:]]
                trace.forward_sinks = sinks[: len(trace.forward_sites)]
                trace.backward_sinks = sinks[len(trace.forward_sites) :]
            trace.in_loss = True
            try:
                loss, aux = original(trainable, *args, **kwargs)
            finally:
                trace.in_loss = False
            if trace.loss_terms:  # each term is an exact 0.0 whose gradient carries the digits
                loss = loss + functools.reduce(jnp.add, trace.loss_terms)
                trace.loss_terms = []
            return loss, aux

        return compute_loss_and_updates

    def _wrap_apply(self, original: Callable, positions: dict[int, tuple[str, str]]) -> Callable:
        hooks = self

        @functools.wraps(original)
        def stateless_apply(optimizer_variables, grads, trainable_variables):
            trace = hooks._trace
            if trace is None:
                return original(optimizer_variables, grads, trainable_variables)
            grads, trainable = list(grads), list(trainable_variables)
            count, end = hooks._trainable_count, hooks._trainable_count + trace.sink_count
            if trace.sink_count and len(grads) >= end:
                trace.sink_gradients = grads[count:end]
                grads = [*grads[:count], *grads[end:]]
                trainable = [*trainable[:count], *trainable[end:]]
            for position, (path, name) in positions.items():
                if grads[position] is None:
                    continue
                gradient_slot = (path, "weight_gradients", name)
                weight_slot = (path, "weights", name)
                hooks._slots.setdefault(gradient_slot)
                hooks._slots.setdefault(weight_slot)
                if not trace.discovering:
                    trace.direct.append(
                        (gradient_slot, *tensor_statistics(grads[position], trace.multiplier))
                    )
                    trace.direct.append((weight_slot, *tensor_statistics(trainable[position])))
            return original(optimizer_variables, grads, trainable)

        return stateless_apply

    # -- recording (at trace time, inside the train step)

    def probe(self, tensor: jax.Array, forward: Slot, backward: Slot) -> jax.Array:
        """Records `tensor` and, inside the loss function, the gradient flowing back into it."""
        trace = self._trace
        self._slots.setdefault(forward)
        self._slots.setdefault(backward)
        self.record(forward, tensor)
        if not trace.in_loss:  # no gradient is taken outside the loss function
            return tensor
        if trace.discovering:
            trace.backward_sites.append(backward)
            return tensor
        sink = trace.next_sink(True, backward)
        multiplier = jnp.float32(1.0) if trace.multiplier is None else trace.multiplier
        return _observe(tensor, sink, multiplier)

    def record(self, slot: Slot, tensor: jax.Array) -> None:
        """Records a forward value: through a sink inside the loss function, directly outside it."""
        trace = self._trace
        self._slots.setdefault(slot)
        if trace.discovering:
            if trace.in_loss:
                trace.forward_sites.append(slot)
            return
        counts, floats = tensor_statistics(tensor)
        if not trace.in_loss:
            trace.direct.append((slot, counts, floats))
            return
        sink = trace.next_sink(False, slot)
        trace.loss_terms.append(jnp.sum(sink * lax.stop_gradient(_encode(counts, floats))))

    def _step_statistics(self, trace: _StepTrace) -> dict[Slot, tuple[jax.Array, jax.Array]]:
        """The step's measurements by slot, as `[calls, ...]` stacks of counts and floats."""
        if trace.forward_used != len(trace.forward_sites) or trace.backward_used != len(
            trace.backward_sites
        ):
            raise ProfileError(
                "autoprec profiling on JAX: the train step probed fewer tensors than its "
                "abstract pass; the model's forward pass must trace the same way twice."
            )
        rows = list(trace.direct)
        if trace.sink_count:
            if trace.sink_gradients is None or len(trace.sink_gradients) != trace.sink_count:
                raise ProfileError(
                    "autoprec profiling on JAX: the optimizer's stateless_apply did not receive "
                    "the gradients of the profiler's sinks; a custom train_step must pass the "
                    "gradients of every trainable value it differentiated to stateless_apply."
                )
            sites = [*trace.forward_sites, *trace.backward_sites]
            for slot, gradient in zip(sites, trace.sink_gradients):
                rows.append((slot, *_decode(gradient)))
        grouped: dict[Slot, tuple[list, list]] = {}
        for slot, counts, floats in rows:
            entry = grouped.setdefault(slot, ([], []))
            entry[0].append(counts)
            entry[1].append(floats)
        return {
            slot: (jnp.stack(counts), jnp.stack(floats))
            for slot, (counts, floats) in grouped.items()
        }

    # -- reading

    def _fold(self) -> None:
        """Adds the steps still on the device into the host totals (waits for them)."""
        pending, self._pending = self._pending, []
        for step in jax.device_get(pending):
            for slot, (counts, floats) in step.items():
                totals = [host_statistics(counts, floats)]
                if slot in self._totals:
                    totals.append(self._totals[slot])
                self._totals[slot] = _combine(totals)

    def read(self) -> dict[Slot, tuple[np.ndarray, np.ndarray]]:
        """Returns `{slot: (int64 counts, float64 floats)}` summed over the steps run so far."""
        self._fold()
        empty = (np.zeros(RAW_COUNT_SLOTS, np.int64), np.array([0.0, np.inf, 0.0, 0.0]))
        return {slot: self._totals.get(slot, empty) for slot in self._slots}

    def steps_recorded(self) -> int:
        """Returns the number of train steps run with the probes so far."""
        return self._steps


def _combine(totals: Iterable[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Adds host totals: counts and sums add, maxima and minima combine."""
    items = list(totals)
    counts = np.sum([counts for counts, _ in items], axis=0)
    floats = np.stack([floats for _, floats in items])
    return counts, np.array(
        [floats[:, 0].max(), floats[:, 1].min(), floats[:, 2].sum(), floats[:, 3].sum()]
    )


def is_float_tensor(value: object) -> bool:
    """Returns whether `value` is a JAX array (or tracer) with a floating-point dtype."""
    return isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jnp.floating)


def xla_can_host_probes() -> bool:
    """Returns `True`: JAX compiles every step with XLA, probes included."""
    return True


def write_histograms(
    logdir: str | os.PathLike,
    series: Iterable[tuple[str, np.ndarray, np.ndarray]],
    step: int = 0,
    description: Callable[[str], str] | None = None,
) -> None:
    """Writes exponent histograms as TensorBoard summaries with TensorFlow's writer, if installed.

    TensorBoard event files are written by TensorFlow's summary writer, as Keras'
    own `TensorBoard` callback does on the JAX backend.

    Raises:
        BackendError: if TensorFlow cannot be imported in this process.
    """
    try:
        from . import tensorflow as tensorflow_backend
    except ImportError as error:
        raise BackendError(
            "Profile.to_tensorboard writes TensorBoard event files with TensorFlow's summary "
            "writer, and TensorFlow cannot be imported in this process. Install tensorflow "
            "(tensorflow-cpu is enough), or save the profile with Profile.save(path) and call "
            "Profile.load(path).to_tensorboard(logdir) where TensorFlow is installed."
        ) from error
    tensorflow_backend.write_histograms(logdir, series, step=step, description=description)
