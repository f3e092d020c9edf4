"""`PlanCallback`: the Keras callback that applies a precision plan inside `fit`."""

from __future__ import annotations

import logging
import os

import keras

from .._core.dtypes import BFLOAT16, FLOAT16, FLOAT32, count_dtypes, counts_text
from .._core.models import strategy_scope
from ..errors import BackendError, PlanError
from ..hardware import HardwareProfile, resolve_hardware
from ..layers import is_fully_built
from ..plan import PrecisionPlan
from ..profiler import ProfileCallback
from .apply import PlanHandle, apply_plan
from .guard import (
    Attribution,
    GuardAction,
    GuardConfig,
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
    current_loss_scale,
    scales_loss,
    step_skipping_optimizer,
)
from .saving import attach_plan
from .telemetry import GuardTelemetry, StepRecord
from .tensorboard import TrainingLog

logger = logging.getLogger("autoprec")


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
    `restore()` undoes it. `autoprec.AutoPrecision` is this callback plus the
    automatic mode that decides a plan when none is given.

    Args:
        plan: a `PrecisionPlan` or the path of a plan JSON file.
        loss_scale: `"dynamic"` (start at 2**15, halve on overflow, double after
            `dynamic_growth_steps` finite steps), a number for a fixed scale, or
            `None` for no loss scaling (refused when a layer runs in float16).
        loss_scale_floor: the dynamic scale never drops below this.
        dynamic_growth_steps: finite steps before the dynamic scale doubles.
        strict: passed to `apply_plan`: refuse a plan that does not fit the model.
        plan_path: if given, the plan as applied is saved there at the end of training.
        verbose: 1 prints one line when the plan is applied, 0 is silent.
        hardware: the device the guard promotes for: `"local"` or a hardware
            profile (name or `HardwareProfile`); float16 goes to bfloat16 only
            where bfloat16 runs fast.
        guard: watch for overflow during training and promote the layer where it
            starts (see `autoprec.runtime.guard`).
        on_nan: `"promote"`, `"stop"` or `"raise"` (`NonFiniteTrainingError`).
        guard_threshold: non-finite steps within `guard_window` steps that
            trigger the guard.
        guard_window: steps over which non-finite steps are counted.
        guard_check_every: steps between reads of the in-graph counters.
        check_kernels: before training, run each 16-bit layer once alone; a layer
            whose dtype has no kernel on this device falls back to a wider one.
        tensorboard_dir: if given, the loss scale, layer counts per dtype and
            events are written to `<tensorboard_dir>/autoprec` each epoch.

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
        loss_scale: str | float | None = "dynamic",
        loss_scale_floor: float = 1.0,
        dynamic_growth_steps: int = 2000,
        strict: bool = True,
        plan_path: str | os.PathLike | None = None,
        verbose: int = 1,
        hardware: HardwareProfile | str = "local",
        guard: bool = True,
        on_nan: str = "promote",
        guard_threshold: int = 8,
        guard_window: int = 100,
        guard_check_every: int = 10,
        check_kernels: bool = True,
        tensorboard_dir: str | os.PathLike | None = None,
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
        _check_loss_scale(name, loss_scale, plan)
        self.plan = plan
        self.loss_scale = loss_scale
        self.loss_scale_floor = loss_scale_floor
        self.dynamic_growth_steps = dynamic_growth_steps
        self.strict = strict
        self.plan_path = plan_path
        self.verbose = verbose
        self.hardware = hardware
        self.handle: PlanHandle | None = None
        self.events: list[dict] = []
        self.check_kernels = check_kernels
        self.tensorboard_dir = tensorboard_dir
        self.guard_config = (
            GuardConfig(
                on_nan=on_nan,
                threshold=guard_threshold,
                window=guard_window,
                check_every=guard_check_every,
            )
            if guard
            else None
        )
        self._guard_state: GuardState | None = None
        self._diagnosis: ProfileCallback | None = None
        self._wrapped_optimizer: keras.optimizers.Optimizer | None = None
        self._training_log: TrainingLog | None = None
        self._pending = False
        self._kernels_checked = False
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
        if scale is None:
            return self.plan
        return self.plan.with_metadata(
            loss_scale={
                "mode": "fixed" if not isinstance(self.loss_scale, str) else "dynamic",
                "current": scale,
                "floor": self.loss_scale_floor,
                "dynamic_growth_steps": self.dynamic_growth_steps,
            }
        )

    def restore(self) -> None:
        """Undoes the plan: original policies back, the optimizer unwrapped if this callback wrapped it."""
        if self._telemetry is not None:
            self._telemetry.remove()
            self._telemetry = None
        if self.model is not None and hasattr(self.model, _APPLIED):
            object.__delattr__(self.model, _APPLIED)
        if self.handle is not None:
            self.handle.restore()
        if self._wrapped_optimizer is not None and self.model is not None:
            self.model.optimizer = self._wrapped_optimizer
            self._wrapped_optimizer = None

    # ------------------------------------------------------------------ applying

    def _start(self) -> None:
        """Applies the plan once the model is built (a subclass may decide it first)."""
        self._apply()

    def _apply(self, quiet: bool = False) -> None:
        model = self.model
        compiled = [getattr(model, name, None) for name in _COMPILED_FUNCTIONS]
        applied = getattr(model, _APPLIED, None)
        self.handle = apply_plan(model, self.plan, strict=self.strict)
        unchanged = applied is not None and applied.dtypes == self.handle.dtypes
        if unchanged:
            self._kernels_checked = True  # checked when these dtypes were first applied
        if self.check_kernels and not self._kernels_checked:
            self._kernels_checked = True
            self.handle.restore()  # trace the model as it was, then check 16-bit layers alone
            missing = find_missing_kernels(model, self.handle.dtypes)
            plan = fallback_plan(self.handle.plan, missing, step=self._step)
            self.events.extend(dict(event) for event in plan.events[len(self.handle.plan.events) :])
            self.handle = apply_plan(model, plan, strict=self.strict)
        if self.guard_config is not None and self._guard_state is None:
            self._guard_state = GuardState(self.guard_config)
        self.plan = self.handle.plan
        attach_plan(model, self.plan)
        has_16bit = any(dtype != FLOAT32 for dtype in self.handle.dtypes.values())
        if self.handle.uses_float16:
            if self.loss_scale is None:
                raise PlanError(
                    f"{type(self).__name__}: loss_scale=None, but layers "
                    f"{_float16_layers(self.handle)[:3]} run in float16; use 'dynamic'."
                )
            self._ensure_loss_scaling()
        elif has_16bit and self.guard_config is not None:
            self._ensure_step_skipping()
        unchanged = unchanged and applied.optimizer is model.optimizer
        if unchanged and applied.telemetry is not None and applied.telemetry.installed:
            self._telemetry = applied.telemetry
        elif unchanged and self.guard_config is not None and has_16bit:
            unchanged = applied.telemetry is None and not self._telemetry_supported()
        if unchanged and all(function is not None for function in compiled[:1]):
            # The model already runs this plan: keep its traced functions.
            for name, function in zip(_COMPILED_FUNCTIONS, compiled):
                setattr(model, name, function)
        else:
            self._install_telemetry(has_16bit)
            self._rebuild_compiled_functions()
        object.__setattr__(
            model,
            _APPLIED,
            _AppliedState(dict(self.handle.dtypes), model.optimizer, self._telemetry),
        )
        if self.verbose and not quiet:
            scaling = current_loss_scale(model.optimizer)
            print(
                "autoprec: plan applied to "
                + counts_text(count_dtypes(self.handle.dtypes.values()))
                + " layer(s)"
                + (f"; loss scale {scaling:g}" if scaling is not None else "")
            )

    def _telemetry_supported(self) -> bool:
        return keras.backend.backend() == "tensorflow"

    def _install_telemetry(self, has_16bit: bool) -> None:
        if self._telemetry is not None:
            self._telemetry.remove()
            self._telemetry = None
        if self.guard_config is None or not has_16bit or not self._telemetry_supported():
            return
        with strategy_scope(self.model):
            self._telemetry = GuardTelemetry(
                self.model,
                self.handle.dtypes,
                history_steps=self.guard_config.history_steps,
                near_binades=self.guard_config.near_binades,
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
        fixed = not isinstance(self.loss_scale, str)
        initial_scale = float(self.loss_scale) if fixed else 2.0**15
        floor = None if fixed else self.loss_scale_floor
        with strategy_scope(self.model):
            wrapped = FlooredLossScaleOptimizer(
                optimizer,
                initial_scale=initial_scale,
                dynamic_growth_steps=self.dynamic_growth_steps,
                floor=floor,
                fixed=fixed,
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
        self._diagnosis = ProfileCallback(steps=self.guard_config.diagnose_steps)
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
            f"{self.guard_config.diagnose_steps} diagnosed steps (transient: the dynamic "
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
        bfloat16_fast = self.guard_config.bfloat16_is_fast and self._bfloat16_is_fast()
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
        self._apply(quiet=True)
        optimizer = self.model.optimizer
        if reset_scale and scales_loss(optimizer) and optimizer.built:
            optimizer.dynamic_scale.assign(float(optimizer.initial_scale))
        self._guard_state.resume()
        for message in messages:
            logger.warning(message)
            if self.verbose:
                print(message)

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
        on_nan = self.guard_config.on_nan
        if on_nan == "raise":
            raise NonFiniteTrainingError(f"autoprec guard: {trigger}: {attribution.summary}.")
        if on_nan == "stop":
            self._report_divergence("on_nan='stop'")
            return
        if attribution.cause == "forward":
            self._set_loss_scale(record.loss_scale)
        else:
            self._set_loss_scale(max(self.loss_scale_floor, record.loss_scale))
        self._promote_all(dict(attribution.evidence), self._guard_state.trigger)

    def _lower_loss_scale(self, record: StepRecord, step: int) -> bool:
        """Lowers the dynamic loss scale for gradients that overflowed; `False` when it cannot."""
        optimizer = self.model.optimizer
        minimum = min(self.guard_config.min_loss_scale, self.loss_scale_floor)
        if not scales_loss(optimizer) or optimizer.fixed or record.loss_scale <= minimum:
            return False
        self._failures_in_a_row += 1
        scale = lowered_loss_scale(record.loss_scale, self._failures_in_a_row, minimum)
        self._set_loss_scale(scale)
        if scale < self.loss_scale_floor <= record.loss_scale:
            evidence = (
                f"{record.loss_scale:g} -> {scale:g}, below the floor {self.loss_scale_floor:g}: "
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
        on_nan = self.guard_config.on_nan
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
            self._telemetry.read_records(), self.handle.dtypes, self.guard_config.near_binades
        )
        if not climbing:
            return
        if self.guard_config.on_nan != "promote":
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
        if self.guard_config.on_nan == "raise":
            raise NonFiniteTrainingError(message)
        logger.warning(message)
        if self.verbose:
            print(message)
        self.model.stop_training = True


def _check_loss_scale(
    name: str, loss_scale: str | float | None, plan: PrecisionPlan | None
) -> None:
    """Refuses loss-scale settings that are invalid or unsafe for `plan`."""
    if isinstance(loss_scale, str) and loss_scale != "dynamic":
        raise PlanError(
            f"{name}: loss_scale={loss_scale!r} is not valid; use 'dynamic', "
            "a positive number for a fixed scale, or None."
        )
    if not isinstance(loss_scale, str) and loss_scale is not None and loss_scale <= 0:
        raise PlanError(f"{name}: loss_scale must be positive, got {loss_scale}.")
    if loss_scale is None and plan is not None and plan.uses_float16:
        raise PlanError(
            f"{name}: loss_scale=None, but the plan runs layers in float16, whose "
            "gradients underflow without loss scaling. Use loss_scale='dynamic' (default)."
        )


_APPLIED = "_autoprec_applied_plan"
_COMPILED_FUNCTIONS = ("train_function", "test_function", "predict_function")


class _AppliedState:
    """What a model runs: its dtypes, the optimizer and telemetry they were set up with."""

    def __init__(
        self, dtypes: dict[str, str], optimizer: object, telemetry: GuardTelemetry | None
    ) -> None:
        self.dtypes = dtypes
        self.optimizer = optimizer
        self.telemetry = telemetry


def _attribution_text(record: StepRecord, dtypes: dict[str, str]) -> str:
    """Returns the summary of `attribute_step` for a record (for events and messages)."""
    return attribute_step(record, dtypes).summary


def _float16_layers(handle: PlanHandle) -> list[str]:
    return [path for path, dtype in handle.dtypes.items() if dtype == FLOAT16]
