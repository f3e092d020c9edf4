"""`profile()` and `ProfileCallback`: real train steps with probes, the model left as it was."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import keras
import numpy as np
from numpy.typing import ArrayLike

from .._backends import PROFILER_UNSUPPORTED, instrument_backend
from .._core.data import fit_arguments
from .._core.models import strategy_scope
from ..errors import ProfileError
from .probes import ProbeSession
from .stats import Profile

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
    """Profiles the first `steps` train steps of a real `fit`, then removes its probes.

    After `steps` steps (or at the end of training, if it ends sooner) the
    result is in `.profile`, the probes are removed and the train function is
    rebuilt, so the rest of training runs at full speed. `Dense` and
    `EinsumDense` layers also get their float8 ranges
    (`autoprec.profiler.Float8Ranges`): the statistics of the float8 tensors
    are read on the host after every step for their per-step amax.

    Args:
        steps: number of train steps to record.
        include_pass_through: also probe pass-through layers (Dropout,
            Flatten, MaxPooling, ReLU, ...), which cost time and duplicate
            their producers' statistics.
        stop_training: stop `fit` once the profile is complete.
        float8_ranges: also record what a float8 decision needs for Dense and
            EinsumDense layers (their inputs and pre-activation gradients, read on
            the host after every step); `False` saves that time where float8 is
            not a choice (a device without FP8 tensor cores).

    Example:

    ```python
    profiler = autoprec.ProfileCallback(steps=20)
    model.fit(x, y, epochs=1, callbacks=[profiler])
    print(profiler.profile.summary())
    ```
    """

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
        self.profile = None
        self._session = ProbeSession(self.model, self.include_pass_through)
        if self.float8_ranges:
            self._session.enable_float8_ranges()
        try:
            self._session.install()
        except BaseException:
            self._session.remove()
            self._session = None
            raise

    def on_train_batch_end(self, batch: int, logs: Logs = None) -> None:
        if self._session is not None:
            self._session.observe_step()
        if self._session is not None and self._session.steps_recorded() >= self.steps:
            self._finish()
            if self.stop_training:
                self.model.stop_training = True

    def on_train_end(self, logs: Logs = None) -> None:
        if self._session is not None:
            self._finish()

    def remove_probes(self) -> None:
        """Removes the probes now (e.g. after `fit` raised), keeping whatever was recorded."""
        if self._session is not None:
            self._finish()

    def _finish(self) -> None:
        session, self._session = self._session, None
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
        snapshot = _snapshot(model)
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
            _restore(model, snapshot)
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


def _snapshot_variables(model: keras.Model) -> list:
    variables = list(model.variables) + list(model.optimizer.variables)
    variables += list(getattr(model, "metrics_variables", []))
    unique = {id(variable): variable for variable in variables}
    return list(unique.values())


def _snapshot(model: keras.Model) -> dict[str, Any]:
    variables = _snapshot_variables(model)
    return {
        "values": [(variable, np.array(variable.numpy(), copy=True)) for variable in variables],
        "attributes": {
            name: vars(model)[name] for name in ("history", "stop_training") if name in vars(model)
        },
    }


def _restore(model: keras.Model, snapshot: dict[str, Any]) -> None:
    known = {id(variable) for variable, _ in snapshot["values"]}
    for metric in getattr(model, "metrics", []):
        if any(id(variable) not in known for variable in metric.variables):
            metric.reset_state()
    for variable, value in snapshot["values"]:
        variable.assign(value)
    for name, value in snapshot["attributes"].items():
        object.__setattr__(model, name, value)
