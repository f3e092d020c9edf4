"""`AutoPrecision`: the Keras callback that trains a model with a per-layer precision plan."""

from __future__ import annotations

import os

from ._auto import decide_plan, report_lines
from .cost import Estimate
from .errors import BackendError, PlanError
from .hardware import HardwareProfile
from .plan import PrecisionPlan
from .profiler import Profile, ProfileCallback
from .runtime.training import PlanCallback
from .search import Budget, SearchResult, SearchSettings, search


class AutoPrecision(PlanCallback):
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
    `autoprec.save_model` use it; `restore()` undoes it. With a plan it behaves
    as `autoprec.runtime.PlanCallback`, which it extends.

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
            starts (see `autoprec.runtime.guard`); every promotion is logged and recorded
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

    _decides_plan = True

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
        hardware: HardwareProfile | str = "local",
        batch_size: int = 32,
        guard: bool = True,
        on_nan: str = "promote",
        guard_threshold: int = 8,
        guard_window: int = 100,
        guard_check_every: int = 10,
        check_kernels: bool = True,
        tensorboard_dir: str | os.PathLike | None = None,
        search: bool | Budget = False,
        search_data: tuple | None = None,
        search_trials: int = 8,
    ) -> None:
        if plan is None and loss_scale is None:
            raise PlanError(
                "AutoPrecision: loss_scale=None needs an explicit plan without float16 layers; "
                "the automatic plan may use float16. Keep loss_scale='dynamic'."
            )
        super().__init__(
            plan,
            loss_scale=loss_scale,
            loss_scale_floor=loss_scale_floor,
            dynamic_growth_steps=dynamic_growth_steps,
            strict=strict,
            plan_path=plan_path,
            verbose=verbose,
            hardware=hardware,
            guard=guard,
            on_nan=on_nan,
            guard_threshold=guard_threshold,
            guard_window=guard_window,
            guard_check_every=guard_check_every,
            check_kernels=check_kernels,
            tensorboard_dir=tensorboard_dir,
        )
        self.profile_steps = profile_steps
        self.batch_size = batch_size
        self.profile: Profile | None = None
        self.estimate: Estimate | None = None
        self.search_budget = _search_budget(search, search_data, self.plan)
        self.search_data = search_data
        self.search_trials = search_trials
        self.search_result: SearchResult | None = None
        self._profiler: ProfileCallback | None = None

    # ------------------------------------------------------------------ Keras hooks

    def on_train_batch_end(self, batch, logs=None) -> None:
        if self._profiler is None:
            super().on_train_batch_end(batch, logs)
            return
        self._step += 1
        self._profiler.on_train_batch_end(batch, logs)
        if self._profiler.profile is not None:
            self._decide_and_apply()

    def on_train_end(self, logs=None) -> None:
        if self._profiler is not None:  # training ended before the profile was complete
            self._decide_and_apply()
        super().on_train_end(logs)

    # ------------------------------------------------------------------ automatic mode

    def _start(self) -> None:
        if self.plan is not None:
            super()._start()
            return
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
        if self._profiler is not None:
            if self._profiler.profile is None:
                self._profiler.remove_probes()
            self.profile = self._profiler.profile
            self._profiler = None
        if self.search_budget is not None:
            train_data, val_data = self.search_data
            self.search_result = search(
                self.model,
                train_data,
                val_data,
                budget=self.search_budget,
                hardware=self.hardware,
                n_trials=self.search_trials,
                verbose=0,
                settings=SearchSettings(profile=self.profile, batch_size=self.batch_size),
            )
            self.plan, self.estimate = self.search_result.plan, None
        else:
            self.plan, self.estimate = decide_plan(
                self.model, self.profile, hardware=self.hardware, batch_size=self.batch_size
            )
        self._apply(quiet=True)
        if self.verbose:
            print("\n".join(report_lines(self.plan, self.estimate, self.handle.dtypes)))


def _search_budget(
    search: bool | Budget | None, search_data: tuple | None, plan: PrecisionPlan | None
) -> Budget | None:
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
    if search is True:
        return Budget("val_loss", max_relative_drop=0.02)
    if not isinstance(search, Budget):
        raise PlanError(
            f"AutoPrecision: search must be True or an autoprec.Budget, got {type(search).__name__}."
        )
    return search
