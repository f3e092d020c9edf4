"""Logs of a guarded run: a step the guard skipped leaves no NaN in the loss or the metrics."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

import keras

from .._backends import instrument_backend
from .._core.models import swap_attribute

#: The key `fit`'s logs gain while the guard is on.
SKIPPED_STEPS = "skipped_steps"

_INSTALLED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
        logs = _INSTALLED.get(model)
        if logs is None:
            logs = cls(model)
            _INSTALLED[model] = logs
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
