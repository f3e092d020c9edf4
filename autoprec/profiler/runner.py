"""In-step probes and the runs that use them: which layer calls the probes (and the guard's telemetry)
wrap; `ProbeSession` installs, reads and removes the probes; `profile()` and `ProfileCallback` run
real train steps with them, the model left as it was."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any, TypeAlias

import keras
import numpy as np
from numpy.typing import ArrayLike

from .._backends import PROFILER_UNSUPPORTED, instrument_backend
from .._backends.instrument import STATISTICS, Slot, is_float_tensor
from .._core.data import fit_arguments
from .._core.dtypes import float8_eligible
from .._core.models import call_model_code, rebuild_train_function, strategy_scope, swap_attribute
from ..errors import ProfileError
from ..layers import (
    is_graph_model,
    is_pass_through,
    layer_paths,
    model_fingerprint,
    observing_attention,
)
from .float8_ranges import Float8Ranges, Float8TensorRange
from .profile_json import ATTENTION_LOGITS, FLOAT8_TENSORS, OUTPUT_KEY, ROOT_PATH, TENSOR_KINDS
from .stats import LayerProfile, Profile
from .tensor_stats import TensorStats

#: Slot kind of the tensors recorded only for float8 ranges (not a `LayerProfile` kind).
FLOAT8_SLOT_KIND = "float8"

#: What a layer's recording returns when it raised.
_UNRECORDED = object()

#: Name of the kernel among a float8-eligible layer's weights.
KERNEL_WEIGHT = "kernel"

#: One `observe_step()`: the steps recorded so far and the raw `(counts, floats)` by slot.
Observation = tuple[int, dict[Slot, tuple[np.ndarray, np.ndarray]]]


#: Attributes Keras hangs on tensors that a wrapped output must carry on:
#: the mask, and the logits behind a softmax/sigmoid output (the loss reads them).
KERAS_TENSOR_ATTRIBUTES = ("_keras_mask", "_keras_logits")


def instrumented_layers(
    model: keras.Model, include_pass_through: bool = False
) -> dict[str, keras.layers.Layer]:
    """Returns the layers whose calls are wrapped, by stable path (none inside an RNN's loop)."""
    paths = layer_paths(model)
    loops = tuple(
        path + "/" for path, layer in paths.items() if isinstance(layer, keras.layers.RNN)
    )
    chosen = {}
    for path, layer in paths.items():
        if type(layer).__name__ == "InputLayer" or is_graph_model(layer):
            continue
        if not include_pass_through and is_pass_through(layer):
            continue
        if loops and path.startswith(loops):
            continue
        chosen[path] = layer
    return chosen


def replace_float_outputs(
    outputs: Any, is_float: Callable[[Any], bool], replace: Callable[[tuple, Any], Any]
) -> Any:
    """Returns `outputs` with each float tensor at tree path `p` replaced by `replace(p, tensor)`."""
    flat = keras.tree.flatten_with_path(outputs)
    if not any(is_float(value) for _, value in flat):
        return outputs
    replaced = []
    for tree_path, value in flat:
        if is_float(value):
            result = replace(tree_path, value)
            for name in KERAS_TENSOR_ATTRIBUTES:  # the mask and logits Keras hung on `value`
                if getattr(value, name, None) is not None:
                    try:
                        setattr(result, name, getattr(value, name))
                    except AttributeError:  # a tensor type without a __dict__
                        pass
            value = result
        replaced.append(value)
    if len(flat) == 1 and not flat[0][0]:
        return replaced[0]
    return keras.tree.pack_sequence_as(outputs, replaced)


def _weight_owners(model: keras.Model) -> dict[int, tuple[str, str]]:
    """Maps `id(variable)` of each trainable weight to `(layer path, weight name)`."""
    owners = {id(weight): (ROOT_PATH, weight.name) for weight in model.trainable_weights}
    for path, layer in layer_paths(model).items():  # parents first: the deepest owner wins
        for weight in layer.trainable_weights:
            owners[id(weight)] = (path, weight.name)
    names_seen: dict[tuple[str, str], int] = {}
    unique: dict[int, tuple[str, str]] = {}
    for weight_id, (path, name) in owners.items():
        seen = names_seen.get((path, name), 0)
        names_seen[(path, name)] = seen + 1
        unique[weight_id] = (path, name if seen == 0 else f"{name}_{seen}")
    return unique


def _has_activation(layer: keras.layers.Layer) -> bool:
    activation = getattr(layer, "activation", None)
    return activation is not None and activation is not keras.activations.linear


def _kernel_values(layer: keras.layers.Layer) -> np.ndarray | None:
    """A float kernel's values read on the host (for a kernel the optimizer does not record)."""
    kernel = getattr(layer, KERNEL_WEIGHT, None)
    if kernel is None or not is_float_tensor(kernel):
        return None
    return np.asarray(keras.ops.convert_to_numpy(kernel), dtype=np.float32)


class ProbeSession:
    """Probes on a compiled model, recording in every train step from `install()` to `remove()`;
    `collect()` reads them into a `Profile` (arguments and methods in docs/api.md)."""

    def __init__(
        self, model: keras.Model, include_pass_through: bool = False, statistics: str = "histograms"
    ):
        if statistics not in STATISTICS:
            raise ProfileError(f"ProbeSession: statistics must be one of {STATISTICS}.")
        self.statistics = statistics
        self._backend: ModuleType = instrument_backend("autoprec profiling", PROFILER_UNSUPPORTED)
        self.model = model
        self._targets = instrumented_layers(model, include_pass_through)
        self._weight_owners = _weight_owners(model)
        self._hooks: Any | None = None
        self._installed = False
        self._xla = False
        self._undo: list[Callable[[], None]] = []
        self._original_jit_compile: bool | None = None
        self._float8_slots: dict[str, dict[str, Slot]] = {}
        self._fixed_kernels: dict[str, TensorStats] = {}
        self._observations: list[Observation] = []
        #: Paths of the layers whose outputs could not be recorded (their recording raised).
        self.unrecorded: dict[str, None] = {}

    def __enter__(self) -> ProbeSession:
        self.install()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()

    @property
    def probed_tensor_count(self) -> int:
        """Number of tensors recorded, each under its own slot."""
        return 0 if self._hooks is None else self._hooks.tensor_count

    # -- installing

    def enable_float8_ranges(self) -> None:
        """Also records what a float8 decision needs for each `Dense` and `EinsumDense` layer."""
        if self._installed:
            raise ProfileError("enable_float8_ranges() must be called before install().")
        weights = set(self._weight_owners.values())
        for path, layer in self._targets.items():
            if not float8_eligible(type(layer).__name__):
                continue
            gradients = (
                (path, FLOAT8_SLOT_KIND, "output_gradients")
                if _has_activation(layer)
                else (path, "activation_gradients", OUTPUT_KEY)
            )
            slots = {"inputs": (path, FLOAT8_SLOT_KIND, "inputs"), "output_gradients": gradients}
            if (path, KERNEL_WEIGHT) in weights:
                slots["kernel"] = (path, "weights", KERNEL_WEIGHT)
            else:  # not trained: its values now are its values in every step
                kernel = _kernel_values(layer)
                if kernel is not None:
                    self._fixed_kernels[path] = TensorStats.from_values(kernel)
            self._float8_slots[path] = slots

    def install(self) -> None:
        """Wraps the train step, the optimizer and the layer calls, then rebuilds the train function;
        removes what it installed if that raises."""
        try:
            self._install()
        except BaseException:
            self.remove()
            raise

    def _install(self) -> None:
        if getattr(self.model, "_autoprec_probe_session", None) is not None:
            raise ProfileError(
                f"model {self.model.name!r} is already being profiled; finish that profile "
                "(or remove its ProfileCallback) first."
            )
        self._choose_xla()
        hooks = self._hooks = self._hooks or self._backend.ProbeHooks(self._xla, self.statistics)
        hooks.reset()  # installed again: its probes, kept, record afresh
        self._replace(self.model, "_autoprec_probe_session", self)
        hooks.install_step(self.model, self._weight_owners, self._replace)
        for path, layer in self._targets.items():
            float8 = self._float8_slots.get(path)
            inputs_slot = None if float8 is None else float8["inputs"]
            if self.statistics == "amax":
                inputs_slot = (path, "inputs", "input")
            self._replace(layer, "call", self._wrap_call(hooks, path, layer.call, inputs_slot))
            if inputs_slot is not None and hasattr(layer, "quantized_call"):
                # A quantized layer (a float8 policy) runs `quantized_call`, not `call`.
                quantized = self._recording_inputs(hooks, inputs_slot, layer.quantized_call)
                self._replace(layer, "quantized_call", quantized)
            if float8 is not None and float8["output_gradients"][1] == FLOAT8_SLOT_KIND:
                activation = self._wrap_activation(hooks, path, layer.activation)
                self._replace(layer, "activation", activation)
            if isinstance(layer, keras.layers.MultiHeadAttention):
                sink = self._attention_sink(hooks, path)
                attention = observing_attention(layer, layer._compute_attention, sink)
                self._replace(layer, "_compute_attention", attention)
        self._installed = True
        rebuild_train_function(self.model)

    def _choose_xla(self) -> None:
        self._xla = bool(getattr(self.model, "jit_compile", False))
        if self._xla and not self._backend.xla_can_host_probes():
            warnings.warn(
                "autoprec: XLA cannot compile the profiler's probes on this machine; "
                f"model {self.model.name!r} is profiled with jit_compile=False and switched "
                "back to jit_compile=True afterwards.",
                stacklevel=3,
            )
            self._original_jit_compile = True
            self.model.jit_compile = False
            self._xla = False

    def _replace(self, owner: object, name: str, value: object) -> None:
        self._undo.append(swap_attribute(owner, name, value))

    def _wrap_call(
        self, hooks: Any, path: str, original: Callable, inputs_slot: Slot | None = None
    ) -> Callable:
        if inputs_slot is not None:
            original = self._recording_inputs(hooks, inputs_slot, original)

        @functools.wraps(original)
        def call(*args, **kwargs):
            outputs = original(*args, **kwargs)
            if not hooks.recording:
                return outputs
            probed = call_model_code(
                lambda: self._probe_outputs(hooks, path, outputs),
                layer=f"recording layer {path!r}",
                lost="its outputs will not be profiled",
                fallback=_UNRECORDED,
            )
            if probed is _UNRECORDED:
                self.unrecorded[path] = None
                return outputs
            return probed

        return call

    def _recording_inputs(self, hooks: Any, slot: Slot, original: Callable) -> Callable:
        """`original`, its first (float) argument recorded under `slot` while a step is traced."""

        @functools.wraps(original)
        def recording(*args, **kwargs):
            if hooks.recording:
                inputs = args[0] if args else kwargs.get("inputs")
                if self._backend.is_float_tensor(inputs):
                    hooks.record(slot, inputs)
            return original(*args, **kwargs)

        return recording

    def _wrap_activation(self, hooks: Any, path: str, activation: Callable) -> Callable:
        """The layer's activation, its input probed: the matmul output's values and gradients."""
        forward = (path, FLOAT8_SLOT_KIND, "preactivation")
        backward = (path, FLOAT8_SLOT_KIND, "output_gradients")

        @functools.wraps(activation)
        def probed_activation(values, *args, **kwargs):
            if hooks.recording and self._backend.is_float_tensor(values):
                values = hooks.probe(values, forward, backward)
            return activation(values, *args, **kwargs)

        return probed_activation

    def _attention_sink(self, hooks: Any, path: str) -> Callable[[], Callable[[Any], None] | None]:
        slot: Slot = (path, "internals", ATTENTION_LOGITS)

        def sink() -> Callable[[Any], None] | None:
            if not hooks.recording:
                return None
            return lambda logits: hooks.record(slot, logits)

        return sink

    # -- recording (at trace time, inside the train step)

    def _probe_outputs(self, hooks: Any, path: str, outputs: Any) -> Any:
        def probe(tree_path: tuple, value: Any) -> Any:
            key = OUTPUT_KEY + "".join(f"/{part}" for part in tree_path)
            return hooks.probe(
                value, (path, "activations", key), (path, "activation_gradients", key)
            )

        return replace_float_outputs(outputs, self._backend.is_float_tensor, probe)

    # -- collecting and removing

    def steps_recorded(self) -> int:
        """Returns the number of train steps run with probes so far."""
        return 0 if self._hooks is None else self._hooks.steps_recorded()

    def read(self) -> dict[Slot, TensorStats]:
        """Returns the statistics recorded so far, by slot."""
        if self._hooks is None:
            return {}
        return {slot: TensorStats.from_raw(*raw) for slot, raw in self._hooks.read().items()}

    def values_recorded(self) -> int:
        """Returns the number of tensor elements measured so far, over every probe and step."""
        return sum(stats.count for stats in self.read().values())

    def observe_step(self) -> None:
        """Keeps the running statistics of the float8 tensors after a train step."""
        if not self._float8_slots or self._hooks is None:
            return
        steps = self.steps_recorded()
        if steps == 0 or (self._observations and self._observations[-1][0] == steps):
            return
        raw = self._hooks.read()
        wanted = {slot for slots in self._float8_slots.values() for slot in slots.values()}
        self._observations.append((steps, {slot: raw[slot] for slot in wanted if slot in raw}))

    def _steps_per_observation(self) -> int:
        steps = [0, *(step for step, _ in self._observations)]
        return max((after - before for before, after in zip(steps, steps[1:])), default=1)

    def _float8_ranges(self, path: str, totals: dict[Slot, TensorStats]) -> Float8Ranges:
        per_observation = self._steps_per_observation()
        ranges: dict[str, Float8TensorRange] = {}
        for name, slot in self._float8_slots[path].items():
            total = totals.get(slot)
            if total is None or total.count == 0:
                continue
            observed = [
                TensorStats.from_raw(*raw[slot]) for _, raw in self._observations if slot in raw
            ]
            ranges[name] = Float8TensorRange.measure(
                FLOAT8_TENSORS[name][0], total, observed, per_observation
            )
        if "kernel" not in ranges and path in self._fixed_kernels:
            ranges["kernel"] = Float8TensorRange.measure(
                FLOAT8_TENSORS["kernel"][0], self._fixed_kernels[path]
            )
        return Float8Ranges(**ranges)

    def collect(self) -> Profile:
        """Returns what the probes recorded so far as a `Profile` (the probes stay installed)."""
        groups: dict[str, dict[str, dict[str, TensorStats]]] = {}
        totals = self.read()
        for (path, kind, key), stats in totals.items():
            if stats.count == 0 or kind == FLOAT8_SLOT_KIND:
                continue
            groups.setdefault(path, {name: {} for name in TENSOR_KINDS})[kind][key] = stats
        all_paths = layer_paths(self.model)
        layers = {}
        for path in [*all_paths, ROOT_PATH]:
            if path not in groups or path in self.unrecorded:  # partial statistics mislead
                continue
            layer = all_paths.get(path, self.model)
            float8 = self._float8_ranges(path, totals) if path in self._float8_slots else None
            layers[path] = LayerProfile(
                path=path,
                class_name=type(layer).__name__,
                dtype=str(getattr(layer, "compute_dtype", "float32")),
                float8=float8,
                **groups[path],
            )
        return Profile(
            layers=layers,
            steps=self.steps_recorded(),
            model_name=self.model.name,
            fingerprint=model_fingerprint(self.model),
            unrecorded=tuple(self.unrecorded),
        )

    def remove(self) -> None:
        """Restores every wrapped method and rebuilds the train function without probes."""
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        if self._original_jit_compile is not None:
            self.model.jit_compile = self._original_jit_compile
            self._original_jit_compile = None
        if self._installed:
            self._installed = False
            rebuild_train_function(self.model)


#: Model inputs or targets as Keras takes them: one array (NumPy or a tensor),
#: or a list, tuple or dict of arrays.
Arrays: TypeAlias = ArrayLike | Sequence[ArrayLike] | Mapping[str, ArrayLike]

#: What `profile` trains on: an `(x, y)` or `(x, y, sample_weight)` tuple of
#: arrays, a `tf.data.Dataset` or a Python generator of such batches, or a
#: `keras.utils.PyDataset`.
ProfileData: TypeAlias = tuple[Arrays, ...] | Iterable[tuple[Arrays, ...]] | keras.utils.PyDataset

#: The metric logs Keras passes to callback hooks.
Logs: TypeAlias = Mapping[str, float] | None


class ProfileCallback(keras.callbacks.Callback):
    """Profiles the first `steps` train steps of a real `fit` into `.profile`, then removes its
    probes so the rest of training runs at full speed (arguments in docs/api.md)."""

    def __init__(
        self,
        steps: int = 20,
        include_pass_through: bool = False,
        stop_training: bool = False,
        float8_ranges: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ProfileError(f"ProfileCallback: steps must be a positive integer, got {steps!r}.")
        self.steps = steps
        self.include_pass_through = include_pass_through
        self.stop_training = stop_training
        self.float8_ranges = bool(float8_ranges)
        self.profile: Profile | None = None
        self._session: ProbeSession | None = None

    def on_train_begin(self, logs: Logs = None) -> None:
        _require_compiled(self.model, "ProfileCallback")
        self.profile, self._session = None, None
        session = ProbeSession(self.model, self.include_pass_through)
        if self.float8_ranges:
            session.enable_float8_ranges()
        session.install()
        self._session = session

    def on_train_batch_end(self, batch: int, logs: Logs = None) -> None:
        if self._session is not None:
            self._session.observe_step()
        if self._session is not None and self._session.steps_recorded() >= self.steps:
            self.remove_probes()
            if self.stop_training:
                self.model.stop_training = True

    def on_train_end(self, logs: Logs = None) -> None:
        self.remove_probes()

    def remove_probes(self) -> None:
        """Removes the probes now (e.g. after `fit` raised), keeping whatever was recorded."""
        session, self._session = self._session, None
        if session is not None:
            try:
                self.profile = session.collect()
            finally:
                session.remove()


def profile(
    model: keras.Model,
    x: ProfileData,
    *,
    steps: int = 20,
    batch_size: int = 32,
    include_pass_through: bool = False,
    verbose: int = 1,
    float8_ranges: bool = True,
) -> Profile:
    """Records per-layer value ranges over `steps` train steps, leaving the model unchanged.

    Runs `model.fit` for `steps` steps with probes (see `autoprec.profiler`),
    then restores every model weight, the optimizer state and the metric state
    to what they were. `Dense` and `EinsumDense` layers also get what a float8
    decision needs (`LayerProfile.float8`, `Profile.float8_unsafe_layers`). An unbuilt model is first built on one batch, and an
    unbuilt optimizer is built (with its initial state) so it can be restored.

    Args:
        model: a compiled Keras model (TensorFlow or JAX backend).
        x: the training data, as `model.fit` takes it in one argument: an `(x, y)`
            or `(x, y, sample_weight)` tuple of arrays, a `tf.data.Dataset` of
            batches, or a Python generator or `keras.utils.PyDataset` yielding
            batches (see `ProfileData`).
        steps: number of train steps to record (fewer if the data runs out).
        batch_size: batch size for array data, as in `model.fit`.
        include_pass_through: also probe pass-through layers.
        verbose: 0 silent, 1 (default) Keras' progress bar over the profiled steps.
        float8_ranges: also record the float8 ranges of Dense and EinsumDense
            layers (`LayerProfile.float8`); `False` leaves them out (and their
            per-step host reads), as where float8 is not a choice.

    Returns:
        A `Profile`.

    Raises:
        ProfileError: if the model is not compiled or `data` is unusable.
        BackendError: if the Keras backend is neither TensorFlow nor JAX.

    Example:

    ```python
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    prof = autoprec.profile(model, (x, y), steps=10, batch_size=32, verbose=0)
    print(prof.summary())
    ```
    """
    instrument_backend("autoprec.profile", PROFILER_UNSUPPORTED)
    _require_compiled(model, "autoprec.profile")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ProfileError(f"autoprec.profile: steps must be a positive integer, got {steps!r}.")
    arguments, sample_inputs = fit_arguments(
        x, steps, batch_size, what="autoprec.profile", error_class=ProfileError
    )
    with strategy_scope(model):
        _ensure_built(model, sample_inputs)
        snapshot = snapshot_state(model)
    callback = ProfileCallback(
        steps,
        include_pass_through=include_pass_through,
        stop_training=True,
        float8_ranges=float8_ranges,
    )
    try:
        model.fit(**arguments, verbose=verbose, callbacks=[callback])
    finally:
        callback.remove_probes()
        with strategy_scope(model):
            restore_state(model, snapshot)
    if callback.profile is None:
        raise ProfileError("autoprec.profile: no train step ran; `x` yielded no batches.")
    return callback.profile


def _require_compiled(model: keras.Model, caller: str) -> None:
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        raise ProfileError(
            f"{caller}: model {getattr(model, 'name', model)!r} is not compiled; profiling "
            "runs real train steps. Call model.compile(optimizer=..., loss=...) first."
        )


def _ensure_built(model: keras.Model, sample_inputs: Any) -> None:
    if not model.built:
        model(sample_inputs, training=False)
    optimizer = model.optimizer
    if not optimizer.built and model.trainable_variables:
        optimizer.build(model.trainable_variables)


def snapshot_state(model: keras.Model) -> dict[str, Any]:
    """Copies every variable of the model, its optimizer and metrics, for `restore_state`."""
    variables = list(model.variables) + list(model.optimizer.variables)
    variables += list(getattr(model, "metrics_variables", []))
    variables = list({id(variable): variable for variable in variables}.values())
    return {
        "values": [(variable, np.array(variable.numpy(), copy=True)) for variable in variables],
        "attributes": {
            name: vars(model)[name] for name in ("history", "stop_training") if name in vars(model)
        },
    }


def restore_state(model: keras.Model, snapshot: dict[str, Any]) -> None:
    """Puts back what `snapshot_state` copied."""
    known = {id(variable) for variable, _ in snapshot["values"]}
    for metric in getattr(model, "metrics", []):
        if any(id(variable) not in known for variable in metric.variables):
            metric.reset_state()
    for variable, value in snapshot["values"]:
        variable.assign(value)
    for name, value in snapshot["attributes"].items():
        object.__setattr__(model, name, value)
