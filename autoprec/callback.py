"""`AutoPrecision`: the Keras callback that trains a model with a per-layer precision plan."""

from __future__ import annotations

import logging
import os

import keras

from ._core.dtypes import BFLOAT16, COMPUTE_DTYPES, FLOAT16, FLOAT32
from .apply import PlanHandle, apply_plan
from .errors import PlanError
from .guard import (
    GuardConfig,
    GuardState,
    NonFiniteTrainingError,
    find_culprit,
    is_finite_number,
    promotion_target,
)
from .kernels import fallback_plan, find_missing_kernels
from .layers import is_fully_built
from .loss_scale import FlooredLossScaleOptimizer, current_loss_scale
from .plan import PrecisionPlan
from .saving import attach_plan

logger = logging.getLogger("autoprec")


class AutoPrecision(keras.callbacks.Callback):
    """Trains with a per-layer precision plan, adding loss scaling whenever a layer runs in float16.

    At the start of training the plan is applied to every layer (sub-layers
    included), the optimizer is wrapped in a `FlooredLossScaleOptimizer` when any
    layer computes in float16 (Keras does this only when the global policy is
    exactly `mixed_float16`), and the compiled train/test/predict functions are
    rebuilt so the new policies take effect. The optimizer's state is kept; an
    optimizer that already scales the loss is not wrapped again. The current loss
    scale is added to the epoch logs (`history.history["loss_scale"]`). An
    unbuilt subclassed model only gets its sub-layers at the first trace, so its
    first step runs with the model's own policies and the plan applies from the
    second step on. The plan
    stays applied after training, so `evaluate`, `predict` and
    `autoprec.save_model` use it; `restore()` undoes it.

    With no plan, it decides one itself: the first `profile_steps` steps run in
    the model's own policies with profiler probes, then the heuristic plan is
    built from the recorded ranges and the layer costs measured on this device
    (cached), applied, and training goes on. A compact report says how many
    layers got each dtype, the predicted speedup and why the float32 layers
    stayed float32 (`callback.plan.metadata["evidence"]`).

    Args:
        plan: a `PrecisionPlan`, the path of a plan JSON file, or `None` to
            profile, decide and apply automatically.
        loss_scale: `"dynamic"` (start at 2**15, halve on overflow, double after
            `dynamic_growth_steps` finite steps), a number for a fixed scale, or
            `None` for no loss scaling (refused when a layer runs in float16).
        loss_scale_floor: the dynamic scale never drops below this (Keras' own
            has no floor and reaches 0.0 after ~140 overflowing steps).
        dynamic_growth_steps: finite steps before the dynamic scale doubles.
        strict: passed to `apply_plan`: refuse a plan that does not fit the model.
        plan_path: if given, the plan as applied is saved there at the end of training.
        verbose: 1 prints one line when the plan is applied, 0 is silent.
        profile_steps: with no plan, steps profiled before deciding.
        hardware: with no plan, `"local"` (measure costs here) or a hardware
            profile name such as `"rtx4090"` (predicted costs).
        batch_size: with no plan, the batch size costs are measured for.
        guard: watch for overflow during training and promote the layer where it
            starts (see `autoprec.guard`); every promotion is logged and recorded
            in `plan.events`.
        on_nan: `"promote"`, `"stop"` or `"raise"` (`NonFiniteTrainingError`).
            A non-finite loss with every layer in float32 is reported as a real
            divergence and stops training.
        guard_threshold: non-finite steps within `guard_window` steps that
            trigger the guard (a loss scale at its floor that still overflows
            triggers it at once). The default leaves room for the few skipped
            steps of a dynamic loss scale settling after the start.
        guard_window: steps over which non-finite steps are counted.
        guard_check_every: steps between reads of the in-graph counters.
        check_kernels: before training, run each 16-bit layer once alone; a layer
            whose dtype has no kernel on this device falls back (float16 ->
            bfloat16 -> float32), logged and recorded in `plan.events`.
        search: with no plan, `True` or an `autoprec.Budget` runs a short Optuna
            search (`search_trials` trials, on `search_data`) after profiling,
            instead of the heuristic; `True` means `Budget("val_loss",
            max_relative_drop=0.02)`. `callback.search_result` holds the result.
        search_data: `(train_data, val_data)` held-out batches for the search,
            each `(x, y)` arrays or a `tf.data.Dataset` (a callback cannot see
            `fit`'s data).
        search_trials: trials of that search.
        tensorboard_dir: if given, per-epoch loss scale and layer counts per dtype
            (scalars), the dtype of every layer and each event (text) are written
            to `<tensorboard_dir>/autoprec`, next to Keras' own TensorBoard logs.

    Example:

    ```python
    model.fit(x, y, epochs=2, callbacks=[autoprec.AutoPrecision()])  # decide automatically

    plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    model.fit(x, y, epochs=2, callbacks=[autoprec.AutoPrecision(plan)])
    ```
    """

    def __init__(
        self,
        plan: PrecisionPlan | str | os.PathLike | None = None,
        loss_scale: str | float | None = "dynamic",
        loss_scale_floor: float = 1.0,
        dynamic_growth_steps: int = 2000,
        strict: bool = True,
        plan_path: str | os.PathLike | None = None,
        verbose: int = 1,
        profile_steps: int = 20,
        hardware: str | object = "local",
        batch_size: int = 32,
        guard: bool = True,
        on_nan: str = "promote",
        guard_threshold: int = 8,
        guard_window: int = 100,
        guard_check_every: int = 10,
        check_kernels: bool = True,
        tensorboard_dir: str | os.PathLike | None = None,
        search: bool | object = False,
        search_data: tuple | None = None,
        search_trials: int = 8,
    ) -> None:
        super().__init__()
        if isinstance(plan, (str, os.PathLike)):
            plan = PrecisionPlan.load(plan)
        if plan is None and loss_scale is None:
            raise PlanError(
                "AutoPrecision: loss_scale=None needs an explicit plan without float16 layers; "
                "the automatic plan may use float16. Keep loss_scale='dynamic'."
            )
        if plan is not None and not isinstance(plan, PrecisionPlan):
            raise PlanError(
                "AutoPrecision: 'plan' must be a PrecisionPlan or a plan JSON path, got "
                f"{type(plan).__name__}."
            )
        if isinstance(loss_scale, str) and loss_scale != "dynamic":
            raise PlanError(
                f"AutoPrecision: loss_scale={loss_scale!r} is not valid; use 'dynamic', "
                "a positive number for a fixed scale, or None."
            )
        if not isinstance(loss_scale, str) and loss_scale is not None and loss_scale <= 0:
            raise PlanError(f"AutoPrecision: loss_scale must be positive, got {loss_scale}.")
        if loss_scale is None and plan is not None and plan.uses_float16:
            raise PlanError(
                "AutoPrecision: loss_scale=None, but the plan runs layers in float16, whose "
                "gradients underflow without loss scaling. Use loss_scale='dynamic' (default)."
            )
        self.plan = plan
        self.loss_scale = loss_scale
        self.loss_scale_floor = loss_scale_floor
        self.dynamic_growth_steps = dynamic_growth_steps
        self.strict = strict
        self.plan_path = plan_path
        self.verbose = verbose
        self.handle: PlanHandle | None = None
        self._wrapped_optimizer: keras.optimizers.Optimizer | None = None
        self._pending = False
        self.profile_steps = profile_steps
        self.hardware = hardware
        self.batch_size = batch_size
        self.profile = None
        self.estimate = None
        self._profiler = None
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
        self._diagnosis = None
        self._trigger = ""
        self._step = 0
        self.events: list[dict] = []
        self.check_kernels = check_kernels
        self.tensorboard_dir = tensorboard_dir
        self.search_budget = _search_budget(search, search_data, plan)
        self.search_data = search_data
        self.search_trials = search_trials
        self.search_result = None
        self._training_log = None
        self._kernels_checked = False

    # ------------------------------------------------------------------ Keras hooks

    def on_train_begin(self, logs=None) -> None:
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
        elif self._profiler is not None:
            self._profiler.on_train_batch_end(batch, logs)
            if self._profiler.profile is not None:
                self._decide_and_apply()
        elif self._diagnosis is not None:
            self._diagnosis.on_train_batch_end(batch, logs)
            if self._diagnosis.profile is not None:
                self._finish_diagnosis()
        elif self.guard_config is not None and self.handle is not None:
            if self._step % self.guard_config.check_every == 0:
                self._check(logs)

    # ------------------------------------------------------------------ guard

    def _check(self, logs) -> None:
        optimizer = self.model.optimizer
        loss_finite = is_finite_number((logs or {}).get("loss", 0.0))
        if isinstance(optimizer, FlooredLossScaleOptimizer) and optimizer.built:
            bad_steps = int(keras.ops.convert_to_numpy(optimizer.non_finite_steps))
            scale = float(keras.ops.convert_to_numpy(optimizer.dynamic_scale))
            if not self._guard_state.observe(self._step, bad_steps, scale, optimizer.floor):
                return
            self._trigger = (
                f"{sum(n for _, n in self._guard_state.recent)} non-finite step(s) in the last "
                f"{self.guard_config.window} steps, loss scale {scale:g}"
            )
        elif loss_finite:
            return
        else:
            self._trigger = f"non-finite loss at step {self._step}"
        self._act()

    def _act(self) -> None:
        sixteen_bit = [path for path, d in self.handle.dtypes.items() if d != FLOAT32]
        if not sixteen_bit:
            self._report_divergence(
                "every layer computes in float32: this is a training "
                "divergence, not a precision problem"
            )
            return
        if self.guard_config.on_nan == "raise":
            raise NonFiniteTrainingError(f"autoprec guard: {self._trigger}.")
        if self.guard_config.on_nan == "stop":
            self._report_divergence("on_nan='stop'")
            return
        from .errors import BackendError
        from .profiler import ProfileCallback

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

    def _finish_diagnosis(self) -> None:
        from .guard import enters_with_the_data

        profile, self._diagnosis = self._diagnosis.profile, None
        culprit = find_culprit(profile, self.handle.dtypes)
        if culprit is None:
            cause = (
                "NaN entered with the input data"
                if enters_with_the_data(profile)
                else "no 16-bit layer overflowed in the "
                f"{self.guard_config.diagnose_steps} diagnosed steps (transient: the dynamic "
                "loss scale adjusting, or a few bad batches)"
            )
            message = (
                f"autoprec guard: {self._trigger}; {cause}. Not a precision problem: "
                "nothing promoted."
            )
            repeated = any(event["kind"] == "not_precision" for event in self.events)
            logger.log(logging.INFO if repeated else logging.WARNING, message)
            self.events.append(
                {
                    "step": self._step,
                    "kind": "not_precision",
                    "evidence": f"{self._trigger}; {cause}",
                }
            )
            self._guard_state.recent.clear()  # count afresh before diagnosing again
            return
        self._promote(*culprit)

    def _promote(self, path: str, evidence: str) -> None:
        before = self.handle.dtypes[path]
        bfloat16_fast = self.guard_config.bfloat16_is_fast and self._bfloat16_is_fast()
        target = promotion_target(before, bfloat16_fast)
        event = {
            "step": self._step,
            "kind": "promotion",
            "layer": path,
            "from": before,
            "to": target,
            "evidence": evidence,
            "trigger": self._trigger,
        }
        self.events.append(event)
        self.plan = self.plan.with_dtype(path, target).with_event(event)
        verbose, self.verbose = self.verbose, 0
        try:
            self._apply()
        finally:
            self.verbose = verbose
        optimizer = self.model.optimizer
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) and optimizer.built:
            optimizer.dynamic_scale.assign(float(optimizer.initial_scale))
        self._guard_state.recent.clear()
        message = f"autoprec guard: step {self._step}: {path} {before} -> {target} ({evidence})"
        if self.verbose:
            print(message)
        else:
            logger.warning(message)

    def _bfloat16_is_fast(self) -> bool:
        from . import hardware

        try:
            if isinstance(self.hardware, str):
                profile = (
                    hardware.detect() if self.hardware == "local" else hardware.get(self.hardware)
                )
            else:
                profile = self.hardware
            return bool(profile.is_fast(BFLOAT16))
        except Exception:  # unknown device: bfloat16 is still a safe range-wise promotion
            return True

    def _report_divergence(self, why: str) -> None:
        message = f"autoprec guard: {self._trigger}; {why}. Training stopped."
        self.events.append({"step": self._step, "kind": "stopped", "evidence": self._trigger})
        if self.guard_config.on_nan == "raise":
            raise NonFiniteTrainingError(message)
        logger.warning(message)
        if self.verbose:
            print(message)
        self.model.stop_training = True

    def _start(self) -> None:
        if self.plan is not None:
            self._apply()
            return
        from .errors import BackendError
        from .profiler import ProfileCallback

        self._profiler = ProfileCallback(steps=self.profile_steps)
        self._profiler.set_model(self.model)
        try:
            self._profiler.on_train_begin()
        except BackendError as error:
            if self.verbose:
                print(f"autoprec: no profile on this backend ({error}); deciding from costs")
            self._profiler = None
            self._decide_and_apply()
            return
        if self.verbose:
            print(f"autoprec: profiling the first {self.profile_steps} steps in float32")

    def _decide_and_apply(self) -> None:
        from ._auto import decide_plan, report_lines

        if self._profiler is not None:
            if self._profiler.profile is None:
                self._profiler.remove_probes()
            self.profile = self._profiler.profile
            self._profiler = None
        if self.search_budget is not None:
            from .search import search

            train_data, val_data = self.search_data
            self.search_result = search(
                self.model,
                train_data,
                val_data,
                budget=self.search_budget,
                hardware=self.hardware,
                n_trials=self.search_trials,
                profile=self.profile,
                batch_size=self.batch_size,
                verbose=0,
            )
            self.plan, self.estimate = self.search_result.plan, None
        else:
            self.plan, self.estimate = decide_plan(
                self.model, self.profile, hardware=self.hardware, batch_size=self.batch_size
            )
        verbose, self.verbose = self.verbose, 0
        try:
            self._apply()
        finally:
            self.verbose = verbose
        if self.verbose:
            print("\n".join(report_lines(self.plan, self.estimate, self.handle.dtypes)))

    def _apply(self) -> None:
        self.handle = apply_plan(self.model, self.plan, strict=self.strict)
        if self.check_kernels and not self._kernels_checked:
            self._kernels_checked = True
            self.handle.restore()  # trace the model as it was, then check 16-bit layers alone
            missing = find_missing_kernels(self.model, self.handle.dtypes)
            plan = fallback_plan(self.handle.plan, missing, step=self._step)
            self.events.extend(dict(event) for event in plan.events[len(self.handle.plan.events) :])
            self.handle = apply_plan(self.model, plan, strict=self.strict)
        if self.guard_config is not None and self._guard_state is None:
            self._guard_state = GuardState(self.guard_config)
        self.plan = self.handle.plan
        attach_plan(self.model, self.plan)
        if self.handle.uses_float16:
            if self.loss_scale is None:
                raise PlanError(
                    "AutoPrecision: loss_scale=None, but layers "
                    f"{_float16_layers(self.handle)[:3]} run in float16; use 'dynamic'."
                )
            self._ensure_loss_scaling()
        self._rebuild_compiled_functions()
        if self.verbose:
            counts = {dtype: 0 for dtype in COMPUTE_DTYPES}
            for dtype in self.handle.dtypes.values():
                counts[dtype] += 1
            scaling = current_loss_scale(self.model.optimizer)
            print(
                "autoprec: plan applied to "
                + ", ".join(f"{count} {dtype}" for dtype, count in counts.items() if count)
                + " layer(s)"
                + (f"; loss scale {scaling:g}" if scaling is not None else "")
            )

    def on_epoch_end(self, epoch, logs=None) -> None:
        scale = current_loss_scale(self.model.optimizer)
        if logs is not None and scale is not None:
            logs["loss_scale"] = scale
        if self.tensorboard_dir is not None and self.handle is not None:
            if self._training_log is None:
                from .report import TrainingLog

                self._training_log = TrainingLog(self.tensorboard_dir)
            self._training_log.write_epoch(epoch, self.handle.dtypes, scale, self.plan.events)

    def on_train_end(self, logs=None) -> None:
        if self._profiler is not None:  # training ended before the profile was complete
            self._decide_and_apply()
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

    # ------------------------------------------------------------------ helpers

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
        if self.handle is not None:
            self.handle.restore()
        if self._wrapped_optimizer is not None and self.model is not None:
            self.model.optimizer = self._wrapped_optimizer
            self._wrapped_optimizer = None

    def _ensure_loss_scaling(self) -> None:
        optimizer = self.model.optimizer
        if optimizer is None:
            raise PlanError("AutoPrecision: the model has no optimizer; compile it before fit.")
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            return
        fixed = not isinstance(self.loss_scale, str)
        initial_scale = float(self.loss_scale) if fixed else 2.0**15
        floor = None if fixed else self.loss_scale_floor
        with _strategy_scope(self.model):
            wrapped = FlooredLossScaleOptimizer(
                optimizer,
                initial_scale=initial_scale,
                dynamic_growth_steps=self.dynamic_growth_steps,
                floor=floor,
                fixed=fixed,
            )
            wrapped.build(self.model.trainable_variables)
        self._wrapped_optimizer = optimizer
        self.model.optimizer = wrapped

    def _rebuild_compiled_functions(self) -> None:
        # fit built its train function before on_train_begin; setting it to None
        # here would break fit, so force a rebuild instead.
        self.model.make_train_function(force=True)
        self.model.test_function = None
        self.model.predict_function = None


def _search_budget(search: object, search_data: tuple | None, plan: object) -> object | None:
    """Returns the Budget the callback searches under, or `None`; refuses unusable settings."""
    if search is False or search is None:
        return None
    if plan is not None:
        raise PlanError("AutoPrecision: search= decides a plan; pass it without a plan.")
    if not isinstance(search_data, (tuple, list)) or len(search_data) != 2:
        raise PlanError(
            "AutoPrecision: search= needs search_data=(train_data, val_data), held-out batches "
            "to train and judge candidate plans on (a callback cannot see fit's data)."
        )
    from .search import Budget

    if search is True:
        return Budget("val_loss", max_relative_drop=0.02)
    if not isinstance(search, Budget):
        raise PlanError(
            f"AutoPrecision: search must be True or an autoprec.Budget, got {type(search).__name__}."
        )
    return search


def _float16_layers(handle: PlanHandle) -> list[str]:
    return [path for path, dtype in handle.dtypes.items() if dtype == FLOAT16]


class _NullScope:
    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False


def _strategy_scope(model):
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None and hasattr(strategy, "scope"):
        return strategy.scope()
    return _NullScope()
