"""`PlanCallback`: the Keras callback that applies a precision plan inside `fit`."""

from __future__ import annotations

import dataclasses
import logging
import os
import weakref

import keras

from .._core.dtypes import BFLOAT16, FLOAT16, FLOAT32, count_dtypes, counts_text
from .._core.messages import show_message
from .._core.models import strategy_scope
from ..errors import BackendError, PlanError
from ..hardware import HardwareProfile, resolve_hardware
from ..layers import is_fully_built
from ..plan import PrecisionPlan
from ..profiler import ProfileCallback
from .apply import PlanHandle, apply_plan
from .guard import (
    Attribution,
    Guard,
    GuardAction,
    GuardPhase,
    GuardState,
    NonFiniteTrainingError,
    attribute_step,
    climbing_layers,
    enters_with_the_data,
    find_culprit,
    lowered_loss_scale,
    promotion_target,
)
from .kernels import fallback_plan, find_missing_kernels
from .loss_scale import (
    FlooredLossScaleOptimizer,
    LossScale,
    current_loss_scale,
    resolve_loss_scale,
    scales_loss,
    step_skipping_optimizer,
)
from .saving import attach_plan
from .telemetry import GuardTelemetry, StepRecord
from .tensorboard import TrainingLog

logger = logging.getLogger("autoprec")

#: The guard a callback gets unless told otherwise: `Guard()`, every setting at its default.
DEFAULT_GUARD = Guard()


class PlanCallback(keras.callbacks.Callback):
    """Applies a given precision plan inside `fit`, with loss scaling whenever a layer runs in float16.

    At the start of training the plan is applied to every layer (sub-layers
    included), the optimizer is wrapped in a `FlooredLossScaleOptimizer` when any
    layer computes in float16, and the compiled train/test/predict functions are
    rebuilt so the new policies take effect. The optimizer's state is kept; an
    optimizer that already scales the loss is not wrapped again. The current loss
    scale is added to the epoch logs (`history.history["loss_scale"]`). An
    unbuilt subclassed model only gets its sub-layers at the first trace, so the
    plan applies from its second step on. The plan stays applied after training;
    `restore()` undoes it. A later `fit` of a model that already runs the plan
    (same plan, same compiled functions, same optimizer) changes nothing and does
    not retrace; 16-bit kernels are checked once per model and layer dtype.
    `autoprec.AutoPrecision` is this callback plus the automatic mode that
    decides a plan when none is given.

    The plan must fit the model exactly. To train with the part of a plan that
    fits, apply it first with `handle = autoprec.apply_plan(model, plan,
    strict=False)` and pass `handle.plan`, the plan as applied.

    Args:
        plan: a `PrecisionPlan` or the path of a plan JSON file.
        hardware: the device the guard promotes for: `"local"` or a hardware
            profile (name or `HardwareProfile`); float16 goes to bfloat16 only
            where bfloat16 runs fast.
        loss_scale: `"dynamic"` (`autoprec.LossScale()`: start at 2**15, halve
            on overflow down to a floor of 1, double after 2000 finite steps), an
            `autoprec.LossScale`, a number for a fixed scale, or `None` for no
            loss scaling (refused when a layer runs in float16).
        guard: an `autoprec.Guard`: watch for overflow during training and
            promote the layer where it starts, and check 16-bit kernels before
            training (see `autoprec.runtime.guard`); `None` turns both off.
        plan_path: if given, the plan as applied is saved there at the end of training.
        tensorboard_dir: if given, the loss scale, layer counts per dtype and
            events are written to `<tensorboard_dir>/autoprec` each epoch.
        verbose: 1 shows one line when the plan is applied and each promotion,
            0 is silent. Lines go to stdout while Keras' interactive logging is
            on, else to the `"autoprec"` logger.

    Example:

    ```python
    plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    model.fit(x, y, epochs=2, callbacks=[autoprec.runtime.PlanCallback(plan, verbose=0)])
    ```
    """

    #: Whether `plan=None` is accepted (a subclass that decides the plan itself).
    _decides_plan = False

    def __init__(
        self,
        plan: PrecisionPlan | str | os.PathLike | None,
        *,
        hardware: HardwareProfile | str = "local",
        loss_scale: LossScale | str | float | None = "dynamic",
        guard: Guard | None = DEFAULT_GUARD,
        plan_path: str | os.PathLike | None = None,
        tensorboard_dir: str | os.PathLike | None = None,
        verbose: int = 1,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if isinstance(plan, (str, os.PathLike)):
            plan = PrecisionPlan.load(plan)
        if plan is None and not self._decides_plan:
            raise PlanError(
                f"{name}: a plan is required; pass a PrecisionPlan or a plan JSON path, or "
                "use autoprec.AutoPrecision() to decide one automatically."
            )
        if plan is not None and not isinstance(plan, PrecisionPlan):
            raise PlanError(
                f"{name}: 'plan' must be a PrecisionPlan or a plan JSON path, got "
                f"{type(plan).__name__}."
            )
        if guard is not None and not isinstance(guard, Guard):
            raise PlanError(
                f"{name}: guard must be an autoprec.Guard or None (no guard), got {guard!r}; "
                "e.g. guard=autoprec.Guard(on_nan='stop')."
            )
        self.loss_scale = resolve_loss_scale(loss_scale, name)
        _check_loss_scale(name, self.loss_scale, plan)
        self.plan = plan
        self.hardware = hardware
        self.guard = guard
        self.plan_path = plan_path
        self.tensorboard_dir = tensorboard_dir
        self.verbose = verbose
        self.handle: PlanHandle | None = None
        self.events: list[dict] = []
        self._guard_state: GuardState | None = None
        self._diagnosis: ProfileCallback | None = None
        self._wrapped_optimizer: keras.optimizers.Optimizer | None = None
        self._training_log: TrainingLog | None = None
        self._pending = False
        self._step = 0
        self._telemetry: GuardTelemetry | None = None
        self._failures_in_a_row = 0
        self._last_failed_index = -1

    # ------------------------------------------------------------------ Keras hooks

    def on_train_begin(self, logs=None) -> None:
        if self._guard_state is not None:
            self._guard_state.restart()
        if not is_fully_built(self.model):
            # An unbuilt subclassed model gets its sub-layers (and their paths) at
            # the first trace: start right after the first step.
            self._pending = True
            return
        self._start()

    def on_train_batch_end(self, batch, logs=None) -> None:
        self._step += 1
        if self._pending:
            self._pending = False
            self._start()
        elif self._diagnosis is not None:
            self._diagnose(batch, logs)
        elif self._guard_state is not None and self.handle is not None:
            if self._telemetry is not None:
                if self._guard_state.phase is not GuardPhase.STOPPED:
                    self._watch()
            elif self._guard_state.is_check_due(self._step):
                self._check(logs)

    def on_epoch_end(self, epoch, logs=None) -> None:
        scale = current_loss_scale(self.model.optimizer)
        if logs is not None and scale is not None:
            logs["loss_scale"] = scale
        if self.tensorboard_dir is not None and self.handle is not None:
            if self._training_log is None:
                self._training_log = TrainingLog(self.tensorboard_dir)
            self._training_log.write_epoch(epoch, self.handle.dtypes, scale, self.plan.events)

    def on_train_end(self, logs=None) -> None:
        if self._diagnosis is not None:
            self._diagnosis.remove_probes()
            self._diagnosis = None
        if self._training_log is not None:
            self._training_log.close()
            self._training_log = None
        if self.plan is None:
            return
        plan = self.current_plan()
        attach_plan(self.model, plan)
        if self.plan_path is not None:
            plan.save(self.plan_path)

    # ------------------------------------------------------------------ public

    def current_plan(self) -> PrecisionPlan:
        """Returns the plan as applied, with the loss-scale settings recorded in its metadata."""
        scale = current_loss_scale(self.model.optimizer) if self.model is not None else None
        if scale is None or self.loss_scale is None:
            return self.plan
        return self.plan.with_metadata(
            loss_scale={
                "mode": "dynamic" if self.loss_scale.dynamic else "fixed",
                "current": scale,
                "floor": self.loss_scale.floor,
                "dynamic_growth_steps": self.loss_scale.growth_steps,
            }
        )

    def restore(self) -> None:
        """Undoes the plan: original policies back, the optimizer unwrapped if this callback wrapped it."""
        if self._telemetry is not None:
            self._telemetry.remove()
            self._telemetry = None
        state = getattr(self.model, _APPLIED, None) if self.model is not None else None
        if state is not None:
            object.__delattr__(self.model, _APPLIED)
            self._wrapped_optimizer = self._wrapped_optimizer or state.unwrapped_optimizer
        if self.handle is not None:
            self.handle.restore()
        if self._wrapped_optimizer is not None and self.model is not None:
            self.model.optimizer = self._wrapped_optimizer
            self._wrapped_optimizer = None

    # ------------------------------------------------------------------ applying

    def _start(self) -> None:
        """Applies the plan once the model is built (a subclass may decide it first)."""
        self._apply()

    def _apply(self, quiet: bool = False, check_kernels: bool = True) -> None:
        """Applies `self.plan`, or keeps what the model runs when that is this plan already."""
        model = self.model
        state = getattr(model, _APPLIED, None)
        if state is not None and state.runs(model, self.plan, self.guard):
            # The model already runs this plan with these compiled functions:
            # nothing to re-apply, re-check or retrace.
            self.handle, self.plan, self._telemetry = state.handle, state.plan, state.telemetry
        else:
            self._apply_changed(state, check_kernels)
        if self.guard is not None and self._guard_state is None:
            self._guard_state = GuardState(self.guard)
        attach_plan(model, self.plan)
        if not quiet:
            scaling = current_loss_scale(model.optimizer)
            show_message(
                "autoprec: plan applied to "
                + counts_text(count_dtypes(self.handle.dtypes.values()))
                + " layer(s)"
                + (f"; loss scale {scaling:g}" if scaling is not None else ""),
                self.verbose,
            )

    def _apply_changed(self, state: _AppliedState | None, check_kernels: bool) -> None:
        """Sets the policies, checks new 16-bit kernels, adds loss scaling, retraces if needed."""
        model = self.model
        compiled = [getattr(model, name, None) for name in _COMPILED_FUNCTIONS]
        self.handle = self._apply_plan(self.plan)
        if check_kernels and self.guard is not None and self.guard.check_kernels:
            self._fall_back_missing_kernels()
        requested, self.plan = self.plan, self.handle.plan
        has_16bit = any(dtype != FLOAT32 for dtype in self.handle.dtypes.values())
        if self.handle.uses_float16:
            if self.loss_scale is None:
                raise PlanError(
                    f"{type(self).__name__}: loss_scale=None, but layers "
                    f"{_float16_layers(self.handle)[:3]} run in float16; use 'dynamic'."
                )
            self._ensure_loss_scaling()
        elif has_16bit and self.guard is not None:
            self._ensure_step_skipping()
        unchanged = (
            state is not None
            and state.dtypes == self.handle.dtypes
            and state.optimizer is model.optimizer
        )
        if unchanged and state.telemetry is not None and state.telemetry.installed:
            self._telemetry = state.telemetry
        elif unchanged and self.guard is not None and has_16bit:
            unchanged = state.telemetry is None and not self._telemetry_supported()
        if unchanged and compiled[0] is not None:
            # The policies are what they were: keep the traced functions.
            for name, function in zip(_COMPILED_FUNCTIONS, compiled):
                setattr(model, name, function)
        else:
            self._install_telemetry(has_16bit)
            self._rebuild_compiled_functions()
        unwrapped = self._wrapped_optimizer or (state.unwrapped_optimizer if state else None)
        object.__setattr__(
            model,
            _APPLIED,
            _AppliedState(
                requested=requested,
                handle=self.handle,
                guard=self.guard,
                optimizer=model.optimizer,
                unwrapped_optimizer=unwrapped,
                telemetry=self._telemetry,
                train_function=model.train_function,
            ),
        )

    def _apply_plan(self, plan: PrecisionPlan) -> PlanHandle:
        """`apply_plan` in strict mode, its error saying how to train with a partial plan."""
        try:
            return apply_plan(self.model, plan, strict=True)
        except PlanError as error:
            raise PlanError(
                f"{type(self).__name__}: {error} The callback applies plans strictly: to train "
                "with the part that fits, run `handle = autoprec.apply_plan(model, plan, "
                f"strict=False)` before fit and pass `{type(self).__name__}(handle.plan)`."
            ) from error

    def _fall_back_missing_kernels(self) -> None:
        """Moves 16-bit layers without a kernel here to a wider dtype; each (layer, dtype) once."""
        model = self.model
        checked = _CHECKED_KERNELS.setdefault(model, {})
        unchecked = {
            path: dtype
            for path, dtype in self.handle.dtypes.items()
            if dtype != FLOAT32 and (path, dtype) not in checked
        }
        if unchecked:
            self.handle.restore()  # trace the model as it was, then check 16-bit layers alone
            found = {
                (item.path, item.dtype): item for item in find_missing_kernels(model, unchecked)
            }
            for path, dtype in unchecked.items():
                checked[(path, dtype)] = found.get((path, dtype))
            self.handle = self._apply_plan(self.handle.plan)
        missing = [
            checked[(path, dtype)]
            for path, dtype in self.handle.dtypes.items()
            if checked.get((path, dtype)) is not None
        ]
        if missing:
            plan = fallback_plan(self.handle.plan, missing, step=self._step)
            self.events.extend(dict(event) for event in plan.events[len(self.handle.plan.events) :])
            self.handle = self._apply_plan(plan)

    @property
    def _floor(self) -> float:
        """The dynamic loss scale's floor (1 for a fixed scale or none), for the guard."""
        floor = self.loss_scale.floor if self.loss_scale is not None else None
        return floor if floor is not None and self.loss_scale.dynamic else 1.0

    def _telemetry_supported(self) -> bool:
        return keras.backend.backend() in ("tensorflow", "jax")

    def _install_telemetry(self, has_16bit: bool) -> None:
        if self._telemetry is not None:
            self._telemetry.remove()
            self._telemetry = None
        if self.guard is None or not has_16bit or not self._telemetry_supported():
            return
        with strategy_scope(self.model):
            self._telemetry = GuardTelemetry(
                self.model,
                self.handle.dtypes,
                history_steps=self.guard.history_steps,
                near_binades=self.guard.near_binades,
            )
        self._telemetry.install()
        self._last_failed_index = -1
        self._failures_in_a_row = 0

    def _ensure_step_skipping(self) -> None:
        optimizer = self.model.optimizer
        if optimizer is None:
            raise PlanError(
                f"{type(self).__name__}: the model has no optimizer; compile it before fit."
            )
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            return
        with strategy_scope(self.model):
            wrapped = step_skipping_optimizer(optimizer)
            wrapped.build(self.model.trainable_variables)
        self._wrapped_optimizer = optimizer
        self.model.optimizer = wrapped

    def _ensure_loss_scaling(self) -> None:
        optimizer = self.model.optimizer
        if optimizer is None:
            raise PlanError(
                f"{type(self).__name__}: the model has no optimizer; compile it before fit."
            )
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            if scales_loss(optimizer):
                return
            optimizer = optimizer.inner_optimizer  # a step-skipping wrapper: scale it now
            self.model.optimizer = optimizer
        settings = self.loss_scale
        with strategy_scope(self.model):
            wrapped = FlooredLossScaleOptimizer(
                optimizer,
                initial_scale=float(settings.initial),
                dynamic_growth_steps=settings.growth_steps,
                floor=settings.floor if settings.dynamic else None,
                fixed=not settings.dynamic,
            )
            wrapped.build(self.model.trainable_variables)
        self._wrapped_optimizer = self._wrapped_optimizer or optimizer
        self.model.optimizer = wrapped

    def _rebuild_compiled_functions(self) -> None:
        # fit built its train function before on_train_begin; setting it to None
        # here would break fit, so force a rebuild instead.
        self.model.make_train_function(force=True)
        self.model.test_function = None
        self.model.predict_function = None

    # ------------------------------------------------------------------ guard

    def _check(self, logs) -> None:
        optimizer = self.model.optimizer
        counters = None
        if isinstance(optimizer, FlooredLossScaleOptimizer) and optimizer.built:
            counters = (
                int(keras.ops.convert_to_numpy(optimizer.non_finite_steps)),
                float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)),
                optimizer.floor,
            )
        loss = (logs or {}).get("loss", 0.0)
        if self._guard_state.check(self._step, loss, counters) is not None:
            self._act()

    def _act(self) -> None:
        state = self._guard_state
        has_16bit = any(dtype != FLOAT32 for dtype in self.handle.dtypes.values())
        action = state.action(has_16bit)
        if action is GuardAction.DIVERGED:
            self._report_divergence(
                "every layer computes in float32: this is a training "
                "divergence, not a precision problem"
            )
        elif action is GuardAction.RAISE:
            raise NonFiniteTrainingError(f"autoprec guard: {state.trigger}.")
        elif action is GuardAction.STOP:
            self._report_divergence("on_nan='stop'")
        else:
            self._start_diagnosis()

    def _start_diagnosis(self) -> None:
        self._diagnosis = ProfileCallback(steps=self.guard.diagnose_steps)
        self._diagnosis.set_model(self.model)
        try:
            self._diagnosis.on_train_begin()
        except BackendError:
            # No in-graph probes on this backend: no attribution, so every float16
            # layer is promoted (bfloat16 has float32's range).
            self._diagnosis = None
            float16_layers = _float16_layers(self.handle)
            if not float16_layers:
                self._report_divergence(
                    "no float16 layer to promote and no probes on this backend to find the "
                    "layer where it starts"
                )
                return
            for path in float16_layers:
                self._promote(path, "no probes on this backend: every float16 layer promoted")

    def _diagnose(self, batch, logs) -> None:
        self._diagnosis.on_train_batch_end(batch, logs)
        if self._diagnosis.profile is None:
            return
        profile, self._diagnosis = self._diagnosis.profile, None
        culprit = find_culprit(profile, self.handle.dtypes)
        if culprit is not None:
            self._promote(*culprit)
            return
        trigger = self._guard_state.trigger
        cause = (
            "NaN entered with the input data"
            if enters_with_the_data(profile)
            else "no 16-bit layer overflowed in the "
            f"{self.guard.diagnose_steps} diagnosed steps (transient: the dynamic "
            "loss scale adjusting, or a few bad batches)"
        )
        message = f"autoprec guard: {trigger}; {cause}. Not a precision problem: nothing promoted."
        repeated = any(event["kind"] == "not_precision" for event in self.events)
        logger.log(logging.INFO if repeated else logging.WARNING, message)
        self.events.append(
            {"step": self._step, "kind": "not_precision", "evidence": f"{trigger}; {cause}"}
        )
        self._guard_state.resume()  # count afresh before diagnosing again

    def _promote(self, path: str, evidence: str) -> None:
        self._promote_all({path: evidence}, self._guard_state.trigger, reset_scale=True)

    def _promote_all(
        self, evidence: dict[str, str], trigger: str, reset_scale: bool = False
    ) -> None:
        """Promotes every layer in `evidence` at once: one re-apply, one retrace."""
        bfloat16_fast = self.guard.bfloat16_is_fast and self._bfloat16_is_fast()
        messages = []
        plan = self.plan
        for path, why in evidence.items():
            before = self.handle.dtypes[path]
            target = promotion_target(before, bfloat16_fast)
            event = {
                "step": self._step,
                "kind": "promotion",
                "layer": path,
                "from": before,
                "to": target,
                "evidence": why,
                "trigger": trigger,
            }
            self.events.append(event)
            plan = plan.with_dtype(path, target).with_event(event)
            messages.append(
                f"autoprec guard: step {self._step}: {path} {before} -> {target} ({why})"
            )
        self.plan = plan
        self._apply(quiet=True, check_kernels=False)
        optimizer = self.model.optimizer
        if reset_scale and scales_loss(optimizer) and optimizer.built:
            optimizer.dynamic_scale.assign(float(optimizer.initial_scale))
        self._guard_state.resume()
        for message in messages:
            show_message(message, self.verbose, logging.WARNING)

    # ------------------------------------------------------------------ guard (telemetry)

    def _watch(self) -> None:
        telemetry = self._telemetry
        status = telemetry.read_status()
        if not status:
            return
        records = telemetry.read_records(new_only=True)
        telemetry.clear_status()
        latest = records[-1].index if records else 0
        failed = [record for record in records if not record.finite]
        if failed:
            record = failed[0]
            self._on_failed_step(record, self._step - (latest - record.index))
        elif status.near_range:
            self._on_near_range()

    def _set_loss_scale(self, value: float) -> None:
        optimizer = self.model.optimizer
        if scales_loss(optimizer) and optimizer.built and not optimizer.fixed:
            optimizer.dynamic_scale.assign(float(value))

    def _on_failed_step(self, record: StepRecord, step: int) -> None:
        attribution = attribute_step(record, self.handle.dtypes)
        if record.index != self._last_failed_index + 1:
            self._failures_in_a_row = 0
        self._last_failed_index = record.index
        trigger = f"non-finite step {step}"
        self._guard_state.trigger = f"{trigger}: {attribution.summary}"
        if attribution.cause in ("data", "elsewhere"):
            self._set_loss_scale(record.loss_scale)  # not the scale's fault: undo its halving
            self._not_precision(step, attribution)
            return
        if attribution.cause == "backward" and self._lower_loss_scale(record, step):
            return
        self._failures_in_a_row = 0
        on_nan = self.guard.on_nan
        if on_nan == "raise":
            raise NonFiniteTrainingError(f"autoprec guard: {trigger}: {attribution.summary}.")
        if on_nan == "stop":
            self._report_divergence("on_nan='stop'")
            return
        if attribution.cause == "forward":
            self._set_loss_scale(record.loss_scale)
        else:
            self._set_loss_scale(max(self._floor, record.loss_scale))
        self._promote_all(dict(attribution.evidence), self._guard_state.trigger)

    def _lower_loss_scale(self, record: StepRecord, step: int) -> bool:
        """Lowers the dynamic loss scale for gradients that overflowed; `False` when it cannot."""
        optimizer = self.model.optimizer
        minimum = min(self.guard.min_loss_scale, self._floor)
        if not scales_loss(optimizer) or optimizer.fixed or record.loss_scale <= minimum:
            return False
        self._failures_in_a_row += 1
        scale = lowered_loss_scale(record.loss_scale, self._failures_in_a_row, minimum)
        self._set_loss_scale(scale)
        if scale < self._floor <= record.loss_scale:
            evidence = (
                f"{record.loss_scale:g} -> {scale:g}, below the floor {self._floor:g}: "
                + _attribution_text(record, self.handle.dtypes)
            )
            event = {"step": step, "kind": "loss_scale", "evidence": evidence}
            self.events.append(event)
            self.plan = self.plan.with_event(event)
            logger.warning(f"autoprec guard: step {step}: loss scale {evidence}")
        else:
            logger.info(
                f"autoprec guard: step {step}: loss scale {record.loss_scale:g} -> {scale:g}"
            )
        return True

    def _not_precision(self, step: int, attribution: Attribution) -> None:
        message = f"autoprec guard: non-finite step {step}: {attribution.summary}; update skipped."
        event = {"step": step, "kind": "not_precision", "evidence": attribution.summary}
        repeated = any(event["kind"] == "not_precision" for event in self.events)
        self.events.append(event)
        on_nan = self.guard.on_nan
        if on_nan == "raise":
            raise NonFiniteTrainingError(message + " Nothing promoted.")
        if on_nan == "stop":
            self._report_divergence("on_nan='stop'")
            return
        logger.log(
            logging.INFO if repeated else logging.WARNING,
            message + " Not a precision problem: nothing promoted.",
        )

    def _on_near_range(self) -> None:
        climbing = climbing_layers(
            self._telemetry.read_records(), self.handle.dtypes, self.guard.near_binades
        )
        if not climbing:
            return
        if self.guard.on_nan != "promote":
            for path, evidence in climbing.items():
                logger.warning(f"autoprec guard: step {self._step}: {path}: {evidence}")
            return
        self._promote_all(climbing, f"amax near float16's range at step {self._step}")

    def _bfloat16_is_fast(self) -> bool:
        try:
            return bool(resolve_hardware(self.hardware).is_fast(BFLOAT16))
        except Exception:  # unknown device: bfloat16 is still a safe range-wise promotion
            return True

    def _report_divergence(self, why: str) -> None:
        trigger = self._guard_state.trigger
        self._guard_state.stop()
        message = f"autoprec guard: {trigger}; {why}. Training stopped."
        self.events.append({"step": self._step, "kind": "stopped", "evidence": trigger})
        if self.guard.on_nan == "raise":
            raise NonFiniteTrainingError(message)
        show_message(message, self.verbose, logging.WARNING)
        self.model.stop_training = True


def _check_loss_scale(name: str, loss_scale: LossScale | None, plan: PrecisionPlan | None) -> None:
    """Refuses no loss scaling for a plan that runs layers in float16."""
    if loss_scale is None and plan is not None and plan.uses_float16:
        raise PlanError(
            f"{name}: loss_scale=None, but the plan runs layers in float16, whose "
            "gradients underflow without loss scaling. Use loss_scale='dynamic' (default)."
        )


_APPLIED = "_autoprec_applied_plan"
_COMPILED_FUNCTIONS = ("train_function", "test_function", "predict_function")

#: `{model: {(path, dtype): MissingKernel or None}}`: the 16-bit kernels checked on each model.
_CHECKED_KERNELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclasses.dataclass
class _AppliedState:
    """What a model runs: the plan asked for and as applied, and what it was set up with."""

    requested: PrecisionPlan
    handle: PlanHandle
    guard: Guard | None
    optimizer: object
    unwrapped_optimizer: object
    telemetry: GuardTelemetry | None
    train_function: object

    @property
    def plan(self) -> PrecisionPlan:
        return self.handle.plan

    @property
    def dtypes(self) -> dict[str, str]:
        return self.handle.dtypes

    def runs(self, model: keras.Model, plan: PrecisionPlan, guard: Guard | None) -> bool:
        """Whether `model` still runs `plan` as applied here, with nothing reset since."""
        return (
            model.train_function is not None
            and model.train_function is self.train_function
            and model.optimizer is self.optimizer
            and guard == self.guard
            and (self.telemetry is None or self.telemetry.installed)
            and (plan is self.requested or plan is self.plan or plan == self.requested)
        )


_APPLIED = "_autoprec_applied_plan"
_COMPILED_FUNCTIONS = ("train_function", "test_function", "predict_function")


def _attribution_text(record: StepRecord, dtypes: dict[str, str]) -> str:
    """Returns the summary of `attribute_step` for a record (for events and messages)."""
    return attribute_step(record, dtypes).summary


def _float16_layers(handle: PlanHandle) -> list[str]:
    return [path for path, dtype in handle.dtypes.items() if dtype == FLOAT16]
