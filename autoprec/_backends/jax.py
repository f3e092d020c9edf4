"""JAX side of the in-step instrumentation: the profiler's statistics return with each pure train
step's logs; the train function keeps a reference to the batch of a step the optimizer skipped."""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np

from .instrument import (
    KeptStep,
    Replace,
    Slot,
    WeightOwners,
    combine_totals,
    empty_totals,
)
from .jax_probes import StepTrace, host_statistics

#: The logs key under which a probed train step returns its statistics.
LOGS_KEY = "_autoprec_probe_statistics"
#: Steps kept on the device before the host folds them into its totals.
_PENDING_STEPS = 32


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
    unscaled = getattr(optimizer, "loss_scale_factor", None) is None
    if unscaled and not hasattr(optimizer, "inner_optimizer"):
        return None
    mapping = list(zip(optimizer.variables, optimizer_variables))
    with keras.StatelessScope(state_mapping=mapping):
        scale = optimizer.scale_loss(jnp.float32(1.0))
    return jnp.float32(1.0) / jnp.asarray(scale, jnp.float32)


def _wrap_train_functions(
    model: keras.Model, replace: Replace, marker: str, wrap: Callable[[Callable], Callable]
) -> None:
    """Wraps `model.make_train_function` so that each train function it builds runs through `wrap`."""
    make = model.make_train_function

    @functools.wraps(make)
    def make_train_function(force: bool = False):
        result = make(force=force)
        function = model.train_function
        if function is not None and not getattr(function, marker, False):
            model.train_function = wrap(function)
            setattr(model.train_function, marker, True)
        return result

    replace(model, "make_train_function", make_train_function)


class ProbeHooks:
    """The in-step instrumentation on JAX: probes whose exact histograms (whatever `statistics`)
    return with each pure train step's logs, and a reference to each skipped step's batch."""

    def __init__(self, xla: bool = True, statistics: str = "histograms") -> None:
        del xla, statistics
        self._executed: list[tuple[Any, Any, Any]] = []  # (batch, scale before, count after)
        self._failed_count = 0
        self.paused = False
        self._trace: StepTrace | None = None
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
        """Wraps the train step, the loss function, `make_train_function` and `stateless_apply`."""
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
        wrap = functools.partial(self._wrap_train_function, model)
        _wrap_train_functions(model, replace, "_autoprec_probed", wrap)
        replace(
            optimizer, "stateless_apply", self._wrap_apply(optimizer.stateless_apply, positions)
        )

    def _wrap_train_function(self, model: keras.Model, original: Callable) -> Callable:
        """Feeds Keras' step function one batch at a time and takes each step's statistics out."""
        steps_per_execution = max(1, int(getattr(model, "steps_per_execution", 1) or 1))

        def step(state, batch):
            self._ensure_layout(model, state, batch)
            logs, state = original(state, iter((batch,)))
            return self._take(logs), state

        def train_function(state, iterator):
            logs, state = step(state, next(iterator))
            for batch in itertools.islice(iterator, steps_per_execution - 1):
                logs, state = step(state, batch)
            return logs, state

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
        @functools.wraps(original)
        def train_step(state, data):
            if self._trace is not None:  # a nested call: record once, in the outer step
                return original(state, data)
            trainable, non_trainable, optimizer_variables, metrics = state
            forward_sites, backward_sites = self._ensure_layout(model, state, data)
            trace = StepTrace(
                discovering=False,
                multiplier=_inverse_loss_scale(optimizer, optimizer_variables),
                forward_sites=forward_sites,
                backward_sites=backward_sites,
                trainable_count=self._trainable_count,
            )
            trainable = trace.with_sinks(list(trainable))
            self._trace = trace
            try:
                logs, state = original(
                    (trainable, non_trainable, optimizer_variables, metrics), data
                )
            finally:
                self._trace = None
            return {**logs, LOGS_KEY: trace.statistics()}, state

        return train_step

    def _ensure_layout(
        self, model: keras.Model, state: Any, data: Any
    ) -> tuple[list[Slot], list[Slot]]:
        """The probes of the forward pass for batches like `data`, in call order."""
        key = _signature(data)
        if key in self._layouts:
            return self._layouts[key]
        trainable, non_trainable = list(state[0]), list(state[1])
        inputs, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        kwargs = {"training": True} if _takes_training(model) else {}

        def forward(trainable_values, non_trainable_values, inputs):
            return model.stateless_call(trainable_values, non_trainable_values, inputs, **kwargs)[0]

        outer, self._trace = self._trace, StepTrace(discovering=True, multiplier=None, in_loss=True)
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
        @functools.wraps(original)
        def compute_loss_and_updates(trainable_variables, *args, **kwargs):
            trace = self._trace
            if trace is None:
                return original(trainable_variables, *args, **kwargs)
            trainable = list(trainable_variables)
            if not trace.discovering:
                trainable = trace.take_sinks(trainable)
            trace.in_loss = True
            try:
                loss, aux = original(trainable, *args, **kwargs)
            finally:
                trace.in_loss = False
            return trace.add_loss_terms(loss), aux

        return compute_loss_and_updates

    def _wrap_apply(self, original: Callable, positions: dict[int, tuple[str, str]]) -> Callable:
        @functools.wraps(original)
        def stateless_apply(optimizer_variables, grads, trainable_variables):
            trace = self._trace
            if trace is None:
                return original(optimizer_variables, grads, trainable_variables)
            grads, trainable = trace.take_sink_gradients(list(grads), list(trainable_variables))
            for position, (path, name) in positions.items():
                if grads[position] is None:
                    continue
                gradient_slot = (path, "weight_gradients", name)
                self._slots.setdefault(gradient_slot)
                trace.measure(gradient_slot, grads[position], trace.multiplier)
                self.record((path, "weights", name), trainable[position])  # measured directly
            return original(optimizer_variables, grads, trainable)

        return stateless_apply

    # -- recording (at trace time, inside the train step)

    def probe(self, tensor: jax.Array, forward: Slot, backward: Slot) -> jax.Array:
        """Records `tensor` and, inside the loss function, the gradient flowing back into it."""
        self._slots.setdefault(forward)
        self._slots.setdefault(backward)
        self.record(forward, tensor)
        return self._trace.observe_gradient(backward, tensor)

    def record(self, slot: Slot, tensor: jax.Array) -> None:
        """Records a forward value: through a sink inside the loss function, directly outside it."""
        self._slots.setdefault(slot)
        self._trace.record(slot, tensor)

    # -- reading

    def _fold(self) -> None:
        """Adds the steps still on the device into the host totals (waits for them)."""
        pending, self._pending = self._pending, []
        for step in jax.device_get(pending):
            for slot, (counts, floats) in step.items():
                earlier = [self._totals[slot]] if slot in self._totals else []
                self._totals[slot] = combine_totals([host_statistics(counts, floats), *earlier])

    def read(self) -> dict[Slot, tuple[np.ndarray, np.ndarray]]:
        """Returns `{slot: (int64 counts, float64 floats)}` summed over the steps run so far."""
        self._fold()
        empty = empty_totals()
        return {slot: self._totals.get(slot, empty) for slot in self._slots}

    def steps_recorded(self) -> int:
        """Returns the number of train steps run with the probes so far."""
        return self._steps

    def reset(self) -> None:
        """Forgets the statistics recorded so far (the steps traced with the probes stay probed)."""
        self._pending, self._totals, self._steps = [], {}, 0

    # -- the guard's failed steps: no probe, a reference to each batch of the last execution

    def keep_failed_steps(self, model: keras.Model, replace: Replace) -> None:
        """Wraps the train function to keep its batches, the loss scale and the skipped-step count."""

        def keeping(original: Callable) -> Callable:
            optimizer = model.optimizer  # the one this function was built for
            steps_per_execution = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
            positions = {id(variable): index for index, variable in enumerate(optimizer.variables)}
            count_at = positions.get(id(getattr(optimizer, "non_finite_steps", None)))
            scale_at = positions.get(id(getattr(optimizer, "dynamic_scale", None)))

            def train_function(state, iterator):
                if self.paused or count_at is None:  # a replay runs this step, or none skips
                    return original(state, iterator)
                batches = list(itertools.islice(iterator, steps_per_execution))
                if not batches:
                    return original(state, iterator)  # fit's end of data, as Keras raises it
                before = None if scale_at is None else jnp.array(state[2][scale_at], copy=True)
                logs, state = original(state, iter(batches))
                count = jnp.array(state[2][count_at], copy=True)  # the state is donated next
                self._executed = [(batch, before, count) for batch in batches[-1:]]
                return logs, state

            return train_function

        _wrap_train_functions(model, replace, "_autoprec_kept", keeping)

    def kept_step(self) -> KeptStep | None:
        """Returns the newest step skipped since the last call, or `None`."""
        if not self._executed:
            return None
        batch, scale, count = self._executed[-1]
        count = int(count)
        if count == self._failed_count:
            return None
        self._failed_count = count
        return KeptStep(batch, 1.0 if scale is None else float(scale))


def is_float_tensor(value: object) -> bool:
    """Returns whether `value` is a JAX array (or tracer) with a floating-point dtype."""
    return isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jnp.floating)


def xla_can_host_probes() -> bool:
    """Returns whether the probes compile under XLA: always, since JAX compiles every step with it."""
    return True


def every_replica(flag: Any) -> Any:
    """Returns `flag` itself: a JAX step computes on the global batch, so a flag is already global."""
    return flag


# Cost calibration: compiled forward+backward steps, casts and device placement.


def versions() -> dict[str, str]:
    """Returns the framework versions that belong in a measurement's cache key."""
    return {"jax": jax.__version__}


def to_device(value: Any) -> Any:
    """Returns `value` with every NumPy array placed on the default device (once, not per step)."""
    return jax.tree_util.tree_map(
        lambda leaf: jax.device_put(leaf) if isinstance(leaf, np.ndarray) else leaf, value
    )


def random_tensor(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> jax.Array:
    """Returns standard-normal values in `dtype` on the default device, drawn from `rng`."""
    values = rng.standard_normal(shape, dtype=np.float32).astype(jnp.dtype(dtype))
    return jax.device_put(values)


def _symbolic(value: Any) -> Any:
    if isinstance(value, jax.Array):
        return keras.KerasTensor(value.shape, dtype=str(value.dtype))
    return value


def _build(layer: keras.layers.Layer, args: list, kwargs: dict) -> list:
    """Builds `layer` for its arguments; returns `(shape, dtype)` of its float outputs."""
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
    """Returns a function running one compiled forward+backward of a built-on-call `layer`."""
    del jit_compile
    output_specs = _build(layer, args, kwargs)
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    float_positions = [index for index, leaf in enumerate(leaves) if is_float_tensor(leaf)]
    other_positions = [
        index
        for index, leaf in enumerate(leaves)
        if isinstance(leaf, jax.Array) and not is_float_tensor(leaf)
    ]
    trainable_variables = list(layer.trainable_variables)
    state_variables = list(layer.non_trainable_variables)
    rng = np.random.default_rng(1)
    upstream = [random_tensor(shape, dtype, rng) for shape, dtype in output_specs]

    def forward(trainable, float_inputs, state, other_inputs):
        values = list(leaves)
        for index, value in zip(
            [*float_positions, *other_positions], [*float_inputs, *other_inputs]
        ):
            values[index] = value
        call_args, call_kwargs = jax.tree_util.tree_unflatten(treedef, values)
        mapping = list(zip(trainable_variables, trainable)) + list(zip(state_variables, state))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            results = layer(*call_args, **call_kwargs)
        updated = [scope.get_current_value(variable) for variable in state_variables]
        flat = [tensor for tensor in jax.tree_util.tree_leaves(results) if is_float_tensor(tensor)]
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
    """Returns a function casting `elements` float32 values to `dtype` and back (compiled)."""
    source = random_tensor((elements,), "float32", np.random.default_rng(0))
    target = jnp.dtype(dtype)

    def casts(tensor):
        there = tensor.astype(target)
        return there, there.astype(jnp.float32)

    compiled = jax.jit(casts)
    return lambda: jax.block_until_ready(compiled(source))
