"""`PlanCallback`: the Keras callback that applies a precision plan inside `fit`."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import keras

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32, count_dtypes, counts_text
from .._core.models import (
    inner_optimizer,
    rebuild_train_function,
    show_message,
    strategy_scope,
    sync_fit_state,
)
from ..errors import BackendError, PlanError
from ..hardware import HardwareProfile, resolve_hardware
from ..layers import is_fully_built, layer_paths, layer_policy
from ..plan import PrecisionPlan
from .apply import (
    COMPILED_FUNCTIONS,
    AppliedState,
    PlanHandle,
    applied_state,
    apply_plan,
    keep_applied_state,
)
from .float8 import extend_optimizer, lagging_scales
from .guard import (
    FLOAT8_PATIENCE,
    Guard,
    GuardAction,
    GuardDecision,
    GuardWatch,
    NonFiniteTrainingError,
    check_guard_backend,
    decide,
    promotion_target,
)
from .kernels import checked_plan, unchecked_kernels
from .loss_scale import (
    LossScale,
    current_loss_scale,
    is_dynamic_scale,
    is_positive_number,
    resolve_loss_scale,
    wrap_optimizer,
)
from .saving import attach_plan
from .telemetry import (
    GuardTelemetry,
    SkippedStepLogs,
    installed_telemetry,
    remove_installed_telemetry,
)

logger = logging.getLogger("autoprec")

#: The guard a callback gets unless told otherwise: `Guard()`, every setting at its default.
DEFAULT_GUARD = Guard()


class PlanCallback(keras.callbacks.Callback):
    """Applies a given precision plan inside `fit`, with loss scaling where a layer runs float16."""

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
        self.plan = plan
        if guard is not None and not isinstance(guard, Guard):
            raise PlanError(
                f"{name}: guard must be an autoprec.Guard or None (no guard), got {guard!r}; "
                "e.g. guard=autoprec.Guard(on_nan='stop')."
            )
        if guard is not None:
            check_guard_backend(keras.backend.backend(), name)
        self.loss_scale = resolve_loss_scale(loss_scale, name)
        self._plan_starts_scale = loss_scale == "dynamic"  # may start at the plan's profiled scale
        if self.loss_scale is None and self.plan is not None and self.plan.uses_float16:
            raise PlanError(
                f"{name}: loss_scale=None, but the plan runs layers in float16, whose "
                "gradients underflow without loss scaling. Use loss_scale='dynamic' (default)."
            )
        self.hardware = hardware
        self.guard = guard
        self.plan_path = plan_path
        self.tensorboard_dir = tensorboard_dir
        self.verbose = verbose
        self.handle: PlanHandle | None = None
        self._watch = GuardWatch() if guard is not None else None
        self._wrapped_optimizer: keras.optimizers.Optimizer | None = None
        self._training_log: TrainingLog | None = None
        self._pending = False
        self._step = 0
        self._float8_streaks: dict[str, int] = {}
        # (dtypes, train function, optimizer, guard's keeping) of each plan a race traced.
        self._raced: list[tuple[dict[str, str], object, object, object]] = []

    def set_model(self, model) -> None:
        super().set_model(model)
        # fit calls this before any callback's on_train_begin: an optimizer wrapped now is
        # the one a BackupAndRestore placed before this callback restores into.
        if self.plan is not None and is_fully_built(model) and model.optimizer is not None:
            # A model whose own train_step scales no loss gets no float16 (see `_apply_changed`).
            uses_float16 = self.plan.uses_float16 and unscaled_float16_reason(model) is None
            has_16bit = any(dtype != FLOAT32 for dtype in self.plan.resolve().values())
            self._wrap_optimizer(uses_float16, has_16bit)

    def on_epoch_begin(self, epoch, logs=None) -> None:
        if self._watch is not None:
            SkippedStepLogs.for_model(self.model).start_epoch()

    def on_train_begin(self, logs=None) -> None:
        if self._watch is not None:
            self._watch.stopped = False  # a stop holds for one fit
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
        elif self._watch is not None and self.handle is not None:
            self._guard_step(logs)

    def on_epoch_end(self, epoch, logs=None) -> None:
        scale = current_loss_scale(self.model.optimizer)
        if logs is not None and scale is not None:
            logs["loss_scale"] = scale
        if self.tensorboard_dir is not None and self.handle is not None:
            if self._training_log is None:
                self._training_log = TrainingLog(self.tensorboard_dir)
            self._training_log.write_epoch(epoch, self.handle.dtypes, scale, self.plan.events)

    def on_train_end(self, logs=None) -> None:
        if self._training_log is not None:
            self._training_log.close()
            self._training_log = None
        if self.plan is None:
            return
        plan = self.current_plan()
        attach_plan(self.model, plan)
        if self.plan_path is not None:
            plan.save(self.plan_path)

    def current_plan(self) -> PrecisionPlan:
        """Returns the plan as applied, with the loss-scale settings recorded in its metadata."""
        scale = current_loss_scale(self.model.optimizer) if self.model is not None else None
        if scale is None or self.loss_scale is None:
            return self.plan
        return self.plan.with_metadata(
            loss_scale={
                **(self.plan.metadata.get("loss_scale") or {}),
                "mode": "dynamic" if self.loss_scale.dynamic else "fixed",
                "current": scale,
                "floor": self.loss_scale.floor,
                "dynamic_growth_steps": self.loss_scale.growth_steps,
            }
        )

    def restore(self) -> None:
        """Undoes the plan: original policies back, the optimizer unwrapped if this callback wrapped it."""
        if self._watch is not None:
            self._watch.detach()
        state = applied_state(self.model) if self.model is not None else None
        if state is not None:
            keep_applied_state(self.model, None)
            self._wrapped_optimizer = self._wrapped_optimizer or state.unwrapped_optimizer
        if self.handle is not None:
            self.handle.restore()
        self._unwrap_optimizer()

    def _unwrap_optimizer(self) -> None:
        """Puts back the optimizer this callback wrapped, if it did."""
        if self._wrapped_optimizer is not None and self.model is not None:
            self.model.optimizer = self._wrapped_optimizer
            self._wrapped_optimizer = None

    def _start(self) -> None:
        """Applies the plan once the model is built (a subclass may decide it first)."""
        self._apply()

    def _apply(self, quiet: bool = False) -> None:
        """Applies `self.plan`, or keeps what the model runs when that is this plan already."""
        model = self.model
        state = applied_state(model)
        if state is not None and state.runs(model, self.plan, self.guard):
            # The model runs this plan and its compiled functions already: nothing to re-apply,
            # re-check or retrace; the plan keeps the events recorded since it was applied.
            self.handle = state.handle
            self.plan = self.plan if self.plan == state.handle.plan else state.handle.plan
            if self._watch is not None:
                self._watch.telemetry = state.telemetry
        else:
            self._apply_changed(state)
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

    def _apply_changed(self, state: AppliedState | None) -> None:
        """Sets the policies, checks new 16-bit kernels, adds loss scaling, retraces if needed."""
        model = self.model
        compiled = [getattr(model, name, None) for name in COMPILED_FUNCTIONS]
        if self.plan.uses_float16:
            self.plan = self._without_unscaled_float16(self.plan)
        self.handle = self._apply_plan(self.plan)
        if self.guard is not None and self.guard.check_kernels:
            self._fall_back_missing_kernels()
        requested, self.plan = self.plan, self.handle.plan
        has_16bit = any(dtype != FLOAT32 for dtype in self.handle.dtypes.values())
        self._extend_optimizer(state)
        self._wrap_optimizer(self.handle.uses_float16, has_16bit)
        raced = self._raced_function(has_16bit)
        if raced is None and self._keeps_compiled_functions(state, has_16bit) and compiled[0]:
            # The policies are what they were: keep the traced functions.
            for name, function in zip(COMPILED_FUNCTIONS, compiled):
                setattr(model, name, function)
        else:
            self._install_telemetry(has_16bit)  # a race's: the keeping it traced with, if any
            if raced is not None:
                model.train_function = raced  # traced by the race as the epochs run it
            else:
                rebuild_train_function(model)
            model.test_function = model.predict_function = None
        unwrapped = self._wrapped_optimizer or (state.unwrapped_optimizer if state else None)
        keep_applied_state(
            model,
            AppliedState(
                requested=requested,
                handle=self.handle,
                guard=self.guard,
                optimizer=model.optimizer,
                unwrapped_optimizer=unwrapped,
                telemetry=self._watch.telemetry if self._watch is not None else None,
                train_function=model.train_function,
            ),
        )

    def _keeps_compiled_functions(self, state: AppliedState | None, has_16bit: bool) -> bool:
        """Whether the traced functions still fit: same dtypes, optimizer and telemetry."""
        model = self.model
        if state is None:
            # A plan that leaves every layer's policy as it was and needs no telemetry runs
            # the step fit already traced (the one-liner keeping float32 after its first steps).
            return not has_16bit and self._policies_unchanged()
        if state.handle.dtypes != self.handle.dtypes or state.optimizer is not model.optimizer:
            return False
        telemetry = state.telemetry
        if telemetry is None or not telemetry.installed:
            return self._watch is None or not has_16bit
        if self._watch is None:
            telemetry.remove()  # the guard is off now: trace without it
            return False
        self._watch.telemetry = telemetry
        return True

    def _raced_function(self, has_16bit: bool) -> object | None:
        """The train function a race traced for these dtypes with this optimizer and keeping."""
        raced, self._raced = self._raced, []
        keeping = installed_telemetry(self.model)
        for dtypes, function, optimizer, telemetry in raced:
            if (
                dtypes == self.handle.dtypes
                and optimizer is self.model.optimizer
                and (self._watch is None or not has_16bit or telemetry is keeping)
            ):
                return function
        return None

    def _policies_unchanged(self) -> bool:
        """Whether the applied plan left every layer in the policy it had before."""
        paths = layer_paths(self.model)
        return all(
            path in paths and layer_policy(paths[path]).name == policy.name
            for path, policy in self.handle.original_policies.items()
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
        restored = bool(unchecked_kernels(self.model, self.handle.dtypes))
        if restored:
            self.handle.restore()  # check 16-bit layers alone, with the model as it was
        plan = checked_plan(self.model, self.plan, step=self._step)  # the plan as asked for
        if restored or plan is not self.handle.plan:
            self.handle = self._apply_plan(plan)

    def _extend_optimizer(self, state: AppliedState | None) -> None:
        """Rebuilds the optimizer for new float8 variables, state kept (`restore` puts back the new one)."""
        before = inner_optimizer(self.model.optimizer)
        if not extend_optimizer(self.model):
            return
        after = inner_optimizer(self.model.optimizer)
        if self._wrapped_optimizer is before or (
            state is not None and state.unwrapped_optimizer is before
        ):
            self._wrapped_optimizer = after

    def _without_unscaled_float16(self, plan: PrecisionPlan) -> PrecisionPlan:
        """The plan with float16 layers in bfloat16 (or float32) where no loss scale reaches them."""
        reason = unscaled_float16_reason(self.model)
        float16_layers = [path for path, dtype in plan.resolve().items() if dtype == FLOAT16]
        if reason is None or not float16_layers:
            return plan
        target = BFLOAT16 if self._bfloat16_is_fast() else FLOAT32
        evidence = dict(plan.metadata.get("evidence") or {})
        for path in float16_layers:
            plan = plan.with_dtype(path, target)
            evidence[path] = {"kind": "budget", "from": FLOAT16, "dtype": target, "reason": reason}
        show_message(
            f"autoprec: {reason}. Its {len(float16_layers)} float16 layer(s) run in {target}.",
            self.verbose,
        )
        return plan.with_metadata(evidence=evidence)

    def _wrap_optimizer(
        self, uses_float16: bool, has_16bit: bool, plan: PrecisionPlan | None = None
    ) -> None:
        """Adds loss scaling where float16 runs, step skipping where only bfloat16 does (guarded);
        a dynamic scale starts where `plan` (default `self.plan`) says."""
        name = type(self).__name__
        if uses_float16 and self.loss_scale is None:
            float16 = [path for path, dt in self.plan.resolve().items() if dt == FLOAT16]
            raise PlanError(
                f"{name}: loss_scale=None, but layers {float16[:3]} run in float16; use 'dynamic'."
            )
        if uses_float16 or (has_16bit and self.guard is not None):
            replaced = wrap_optimizer(
                self.model, self._starting_scale(plan or self.plan) if uses_float16 else None, name
            )
            if replaced is not None:
                self._wrapped_optimizer = replaced

    def _starting_scale(self, plan: PrecisionPlan) -> LossScale | None:
        """`loss_scale=`; a default dynamic scale starts lower where the plan's profiled float16
        gradients would overflow it (`plan.metadata["loss_scale"]["initial"]`)."""
        scale, start = self.loss_scale, (plan.metadata.get("loss_scale") or {}).get("initial")
        if not self._plan_starts_scale or not is_positive_number(start) or start >= scale.initial:
            return scale
        floor = None if scale.floor is None else min(scale.floor, float(start))
        return dataclasses.replace(scale, initial=float(start), floor=floor)

    def _install_telemetry(self, has_16bit: bool) -> None:
        """Installs the guard's keeping of skipped steps (none without 16-bit layers); an installed
        keeping is reused: it holds no dtype, so a step traced with it stays valid."""
        if self._watch is None or not has_16bit:
            remove_installed_telemetry(self.model)
            if self._watch is not None:
                SkippedStepLogs.for_model(self.model).active = False
                self._watch.attach(None)
            return
        step_logs = SkippedStepLogs.for_model(self.model)  # below the telemetry's wrapper
        telemetry = installed_telemetry(self.model)
        if telemetry is None:
            with strategy_scope(self.model):
                telemetry = GuardTelemetry(self.model)
            telemetry.install()
        else:
            telemetry.forget()  # steps skipped under another plan are not this one's
        step_logs.active = True
        self._watch.attach(telemetry)

    def _guard_step(self, logs) -> None:
        """Reads what the step did, decides (`decide`, a pure function) and carries it out."""
        outcome = self._watch.observe(self._step, logs, self.handle.dtypes, self.guard.near_binades)
        if outcome is None:
            self._check_float8_scales()
            return
        scale = self.loss_scale  # its floor, for a dynamic scale that has one; else 1
        floor = scale.floor if scale is not None and scale.dynamic and scale.floor else 1.0
        decision = decide(
            outcome,
            on_nan=self.guard.on_nan,
            dynamic_scale=is_dynamic_scale(self.model.optimizer),
            floor=floor,
            failures_in_a_row=self._watch.failures_in_a_row,
        )
        self._watch.failures_in_a_row = decision.failures_in_a_row
        self._carry_out(decision, outcome.step)

    def _check_float8_scales(self) -> None:
        """Every `float8_check_every` steps, promotes float8 layers whose scale lags their amax."""
        if not self.handle.uses_float8 or self._step % self.guard.float8_check_every:
            return
        sync_fit_state(self.model)  # JAX's fit holds the newest scales in its own state
        paths = layer_paths(self.model)
        float8 = {
            path: paths[path] for path, dtype in self.handle.dtypes.items() if dtype == FLOAT8
        }
        lagging = lagging_scales(float8)
        streaks = {path: self._float8_streaks.get(path, 0) + 1 for path in lagging}
        due = {
            path: lagging[path]
            + f" on {streaks[path]} check(s) in a row, every {self.guard.float8_check_every} steps"
            for path in lagging
            if streaks[path] >= FLOAT8_PATIENCE
        }
        self._float8_streaks = {path: n for path, n in streaks.items() if path not in due}
        if due:
            self._promote(due, "float8_saturation", self._step)

    def _carry_out(self, decision: GuardDecision, step: int) -> None:
        """Records the decision's events in the plan, sets the loss scale, then acts."""
        reported_before = any(event["kind"] == "not_precision" for event in self.plan.events)
        for event in decision.events:
            self.plan = self.plan.with_event(event)
        if decision.loss_scale is not None:
            self.model.optimizer.dynamic_scale.assign(float(decision.loss_scale))
        action = decision.action
        if action is GuardAction.RAISE:
            raise NonFiniteTrainingError(decision.lines[0])
        if action is GuardAction.PROMOTE:
            self._promote(decision.layers, decision.trigger, step)
        elif action is GuardAction.STOP:
            self._watch.stopped = True
            _show_guard_line(decision.lines[0], self.verbose)
            self.model.stop_training = True
        else:
            quiet = action is GuardAction.LOWER_SCALE or (
                action is GuardAction.SKIP and reported_before
            )
            for line in decision.lines:
                logger.log(logging.INFO if quiet else logging.WARNING, line)

    def _promote(self, evidence: Mapping[str, str], trigger: str, step: int) -> None:
        """Promotes every layer in `evidence` at once: one re-apply, one retrace, one line each."""
        bfloat16_fast = self._bfloat16_is_fast()
        lines = []
        plan = self.plan
        for path, why in evidence.items():
            before = self.handle.dtypes[path]
            target = promotion_target(before, bfloat16_fast, self.plan.float8_source)
            event = {
                "step": step,
                "kind": "promotion",
                "layer": path,
                "from": before,
                "to": target,
                "evidence": why,
                "trigger": trigger,
            }
            plan = plan.with_dtype(path, target).with_event(event)
            lines.append(f"autoprec guard: step {step}: {path} {before} -> {target} ({why})")
        self.plan = plan
        self._apply(quiet=True)  # a promoted layer runs checked, as every plan does
        for line in lines:
            _show_guard_line(line, self.verbose)

    def _bfloat16_is_fast(self) -> bool:
        """Whether the callback's device (`hardware=`) runs bfloat16 fast."""
        try:
            return bool(resolve_hardware(self.hardware).is_fast(BFLOAT16))
        except Exception:  # unknown device: bfloat16 is still a safe range-wise promotion
            return True


class TrainingLog:
    """Writes autoprec's per-epoch scalars and text (`tensorboard_dir`) to a TensorBoard log."""

    def __init__(self, logdir: str | os.PathLike) -> None:
        try:  # TensorFlow stays optional on the JAX backend
            from .._backends import tensorflow as tensorflow_backend
        except ImportError as error:
            raise BackendError(
                f"tensorboard_dir needs TensorFlow to write summaries ({error}); "
                "pip install tensorflow, or leave tensorboard_dir unset."
            ) from None
        self.logdir = os.path.join(os.fspath(logdir), "autoprec")
        self._writer = tensorflow_backend.SummaryWriter(self.logdir)
        self._written_events = 0
        self._last_table: str | None = None

    def write_epoch(
        self,
        epoch: int,
        dtypes: Mapping[str, str],
        loss_scale: float | None,
        events: Sequence[Mapping[str, Any]],
    ) -> None:
        """Writes the epoch's scalars, the dtype table when it changed, and new events."""
        texts = {}
        table = self.dtype_table(dtypes)
        if table != self._last_table:
            texts["autoprec/plan"] = self._last_table = table
        if len(events) > self._written_events:
            texts["autoprec/events"] = self.events_text(events[self._written_events :])
            self._written_events = len(events)
        self._writer.write(epoch, self.scalars(dtypes, loss_scale), texts)

    def close(self) -> None:
        """Closes the event file."""
        self._writer.close()

    @staticmethod
    def scalars(dtypes: Mapping[str, str], loss_scale: float | None) -> dict[str, float]:
        """The per-epoch scalars: the loss scale and how many layers run in each dtype."""
        scalars = {} if loss_scale is None else {"autoprec/loss_scale": loss_scale}
        for dtype, count in count_dtypes(dtypes.values()).items():
            scalars[f"autoprec/layers_{dtype}"] = count
        return scalars

    @staticmethod
    def dtype_table(dtypes: Mapping[str, str]) -> str:
        """A Markdown table of every layer's dtype (TensorBoard renders Markdown text)."""
        rows = "\n".join(f"| `{path}` | {dtype} |" for path, dtype in dtypes.items())
        return f"| layer | dtype |\n|---|---|\n{rows}"

    @staticmethod
    def events_text(events: Sequence[Mapping[str, Any]]) -> str:
        """One Markdown line per event (promotion, fallback, divergence)."""
        lines = []
        for event in events:
            change = f"{event['from']} -> {event['to']}" if "from" in event else ""
            layer = f"`{event['layer']}` " if "layer" in event else ""
            lines.append(
                f"- step {event.get('step')}: {event.get('kind')} {layer}{change} "
                f"({event.get('evidence', '')})"
            )
        return "\n".join(lines)


def _show_guard_line(line: str, verbose: int) -> None:
    """Shows a guard warning once: on stdout while Keras prints (logged at INFO), else logged."""
    if verbose and keras.config.is_interactive_logging_enabled():
        show_message(line, verbose)
        logger.info(line)
    else:
        logger.warning(line)


#: Packages whose `train_step` is Keras' own (it scales the loss through `model.optimizer`).
KERAS_PACKAGES = ("keras", "keras_hub", "keras_nlp", "keras_cv", "tf_keras")


def unscaled_float16_reason(model: keras.Model) -> str | None:
    """Says why float16 layers would train without loss scaling: the model's own `train_step`
    (not Keras' or keras-hub's) calls no `scale_loss`; `None` when they would not."""
    owner = next((cls for cls in type(model).__mro__ if "train_step" in vars(cls)), None)
    if owner is None or owner.__module__.split(".", 1)[0] in KERAS_PACKAGES:
        return None
    try:
        if "scale_loss" in inspect.getsource(owner.train_step):
            return None
    except (OSError, TypeError):
        pass
    optimizers = sorted(
        name
        for name, value in vars(model).items()
        if not name.startswith("_")
        and name != "optimizer"
        and isinstance(value, keras.optimizers.Optimizer)
    )
    stepping = (
        f"its optimizers ({', '.join(optimizers)})" if optimizers else "the optimizers it uses"
    )
    return (
        f"model {model.name!r} trains with its own train_step, which scales no loss before "
        f"taking gradients: {stepping} would step float16 gradients unscaled (small ones "
        "flush to zero). To train those layers in float16, wrap each optimizer in "
        "keras.optimizers.LossScaleOptimizer and take gradients of optimizer.scale_loss(loss)"
    )
