"""The guard's view of training: a skipped step's batch kept by the one in-step instrumentation,
its replay through the probes (amax and non-finite counts per layer) into a `StepRecord`, and the
logs of a guarded run (a skipped step leaves no NaN)."""

from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import numpy as np

from .. import numerics
from .._backends import instrument_backend
from .._backends.instrument import KeptStep, is_float_tensor
from .._core.dtypes import BFLOAT16, FLOAT16, FLOAT32
from .._core.models import swap_attribute, sync_fit_state
from ..profiler.runner import ProbeSession, instrumented_layers, restore_state, snapshot_state

#: The value of a slot nothing was recorded in.
NOT_RECORDED = -1.0
#: The largest finite value of each compute dtype, from `numerics` (`ml_dtypes.finfo`).
FORMAT_MAX: Mapping[str, float] = {
    name: numerics.float_format(name).max for name in (FLOAT16, BFLOAT16, FLOAT32)
}


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
    unrecorded: tuple[str, ...] = ()  # layers whose recording raised

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


def _amax(stats: Any, multiplier: float = 1.0) -> float:
    """The largest magnitude a probe saw: NaN or inf when it saw one, else its largest finite value."""
    if stats is None:
        return NOT_RECORDED
    if stats.nan:
        return math.nan
    return math.inf if stats.nonfinite else stats.max_abs * multiplier


def _largest(values: Sequence[float]) -> float:
    """The largest of recorded values (NaN wins; `NOT_RECORDED` when none was recorded)."""
    recorded = [value for value in values if value != NOT_RECORDED]
    if any(math.isnan(value) for value in recorded):
        return math.nan
    return max(recorded, default=NOT_RECORDED)


def batch_amax(batch: Any) -> float:
    """Returns the largest magnitude of a batch's float arrays (NaN or inf kept)."""
    values = [
        np.asarray(keras.ops.convert_to_numpy(leaf), np.float32)
        for leaf in keras.tree.flatten(batch)
        if is_float_tensor(leaf) or isinstance(leaf, np.ndarray) and leaf.dtype.kind == "f"
    ]
    values = [value for value in values if value.size]
    if not values:
        return 0.0
    with np.errstate(invalid="ignore"):
        return _largest([float(np.max(np.abs(value))) for value in values])


def replay_step(
    model: keras.Model, kept: KeptStep, dtypes: Mapping[str, str], probed: dict
) -> StepRecord:
    """Runs the kept step again with amax probes, applies nothing, and returns its record;
    `probed` keeps the probed step per plan and batch signature for the next replays."""
    sync_fit_state(model)
    function = model.train_function
    snapshot = snapshot_state(model)
    leaves = keras.tree.flatten(kept.batch)
    key = (*sorted(dtypes.items()), *((np.shape(x), str(getattr(x, "dtype", x))) for x in leaves))
    session, traced = probed.get(key, (ProbeSession(model, statistics="amax"), None))
    step = model.train_step

    # `train_on_batch` hands the step `(x, y, sample_weight)`; the step gets what fit gave it.
    def train_step(*args):  # `(data)` on TensorFlow, `(state, data)` on JAX
        return step(*args[:-1], keras.utils.pack_x_y_sample_weight(*args[-1]))

    undo_step = swap_attribute(model, "train_step", train_step)
    try:
        if getattr(model.optimizer, "dynamic_scale", None) is not None:
            model.optimizer.dynamic_scale.assign(kept.loss_scale)
        with session:  # its statistics start from none recorded
            model.train_function = traced or model.train_function
            model.train_on_batch(*keras.utils.unpack_x_y_sample_weight(kept.batch))
            probed[key] = (session, model.train_function)
            stats = session.read()
            unrecorded = tuple(session.unrecorded)
    finally:
        undo_step()
        restore_state(model, snapshot)
        model.train_function = function  # the step fit traced runs on, untouched
    by_kind: dict[tuple[str, str], list[float]] = {}
    for (path, kind, _), value in stats.items():
        if kind == "activation_gradients" and dtypes.get(path) != FLOAT16:
            continue  # bfloat16 has float32's range: its weight gradients are what overflow
        scale = kept.loss_scale if kind.endswith("gradients") else 1.0  # probes unscale them
        by_kind.setdefault((path, kind.replace("weight_", "activation_")), []).append(
            _amax(value, scale)
        )
    layers = {
        path: LayerAmax(
            *(
                _largest(by_kind.get((path, kind), []))
                for kind in ("activations", "inputs", "internals", "activation_gradients")
            )
        )
        for path in telemetry_paths(model, dtypes)
    }
    gradients_finite = all(
        value.nonfinite == 0 for slot, value in stats.items() if slot[1] == "weight_gradients"
    )
    return StepRecord(
        0, kept.loss_scale, batch_amax(kept.batch), gradients_finite, layers, unrecorded
    )


def near_range_layers(
    record: StepRecord, dtypes: Mapping[str, str], binades: float
) -> dict[str, str]:
    """Returns the float16 layers whose finite forward amax in `record` is within `binades`
    binades of 65504, with the figures."""
    threshold = format_max(FLOAT16) / 2.0**binades
    found = {}
    for path, amax in record.layers.items():
        value = amax.forward
        if dtypes.get(path) == FLOAT16 and math.isfinite(value) and value >= threshold:
            headroom = math.log2(format_max(FLOAT16) / value)
            found[path] = (
                f"float16 amax {value:.4g} in the replayed step, {headroom:.2f} binades below 65504"
            )
    return found


# The telemetry installed on each model (by id), so that installing another removes it.
_INSTALLED: weakref.WeakValueDictionary[int, GuardTelemetry] = weakref.WeakValueDictionary()


def telemetry_paths(model: keras.Model, dtypes: Mapping[str, str]) -> list[str]:
    """Returns the paths of the layers the guard attributes: 16-bit layers that compute."""
    return [path for path in instrumented_layers(model) if dtypes.get(path, FLOAT32) != FLOAT32]


def installed_telemetry(model: keras.Model) -> GuardTelemetry | None:
    """Returns the telemetry installed on `model` (by an earlier `fit` or a race), if any."""
    installed = _INSTALLED.get(id(model))
    if installed is not None and installed.model is model and installed.installed:
        return installed
    return None


def remove_installed_telemetry(model: keras.Model) -> None:
    """Removes the telemetry an earlier `fit` left installed on `model`, if any."""
    installed = installed_telemetry(model)
    if installed is not None:
        installed.remove()


class GuardTelemetry:
    """Keeps the batch of each step the optimizer skipped (no per-layer work in a normal step),
    and replays it with amax probes when the host asks."""

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        self.installed = False
        self._hooks = instrument_backend("the autoprec guard").ProbeHooks()
        self._undo: list[Callable[[], None]] = []
        self._probed: dict = {}  # replay_step's probed steps, kept for this fit

    def install(self) -> None:
        """Wraps the train step to keep skipped steps' batches (the caller rebuilds the function)."""
        if self.installed:
            return
        remove_installed_telemetry(self.model)  # left by an earlier fit: its wrapper would nest
        _INSTALLED[id(self.model)] = self
        self._hooks.keep_failed_steps(self.model, self._replace)
        self.installed = True

    def remove(self) -> None:
        """Restores every wrapped method (the caller rebuilds the train function)."""
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        self._probed.clear()
        self.installed = False
        if _INSTALLED.get(id(self.model)) is self:
            del _INSTALLED[id(self.model)]

    def _replace(self, owner: object, name: str, value: object) -> None:
        self._undo.append(swap_attribute(owner, name, value))

    def forget(self) -> None:
        """Marks every step kept so far as read."""
        self._hooks.kept_step()

    def failed_step(self, dtypes: Mapping[str, str]) -> StepRecord | None:
        """Returns the record of the newest step skipped since the last call, replayed with the
        layers computing in `dtypes`, or `None`."""
        kept = self._hooks.kept_step()
        if kept is None:
            return None
        self._hooks.paused = True
        try:
            return replay_step(self.model, kept, dtypes, self._probed)
        finally:
            self._hooks.paused = False


#: The key `fit`'s logs gain while the guard is on.
SKIPPED_STEPS = "skipped_steps"

_STEP_LOGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class SkippedStepLogs:
    """Keeps a guarded run's logs finite and counts its skipped steps."""

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        self.active = False  # True: logs kept finite from the train step's next trace on
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
