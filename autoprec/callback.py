"""`AutoPrecision`: the Keras callback that trains a model with a per-layer precision plan."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from ._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32
from ._core.messages import show_message
from .cost import Estimate
from .decision import (
    FALLBACK_BATCH_SIZE,
    UNPROFILED_STEPS,
    AutoPlan,
    FirstBatchSize,
    StepClock,
    decide_plan,
    decision_budget,
    race_candidates,
    race_lines,
    race_traces,
    race_winner_plan,
    report_lines,
    search_plan,
)
from .decision.race import StepRace
from .errors import BackendError, PlanError
from .hardware import HardwareProfile, is_local, resolve_hardware
from .plan import PrecisionPlan
from .profiler import Profile, ProfileCallback
from .runtime.guard import Guard
from .runtime.kernels import checked_plan
from .runtime.loss_scale import LossScale
from .runtime.training import DEFAULT_GUARD, PlanCallback
from .search import SearchResult, compute_layers

logger = logging.getLogger("autoprec")


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
    second step on. The plan stays applied after training, so `evaluate`,
    `predict` and `autoprec.save_model` use it; `restore()` undoes it. A later
    `fit` of a model that already runs the plan re-applies, re-checks and
    retraces nothing. With a plan it behaves as `autoprec.runtime.PlanCallback`,
    which it extends.

    The plan must fit the model exactly. To train with the part of a plan that
    fits, apply it first with `handle = autoprec.apply_plan(model, plan,
    strict=False)` and pass `AutoPrecision(handle.plan)`.

    With no plan, it decides one itself (settings in `auto`, an
    `autoprec.AutoPlan`): the first `auto.profile_steps` steps run in the
    model's own policies with profiler probes (none where the only fast dtype
    is bfloat16, whose range is float32's), then the heuristic plan is built
    from the recorded ranges and the layer costs at the batch size `fit` uses
    (read from its first batch, or `auto.batch_size`), measured on this device
    (cached) or predicted for `hardware`. Where costs are measured here, the
    next steps of `fit` then time the whole train step of float32, the uniform
    16-bit policies the device runs fast and the per-layer plan, interleaved
    (`auto.timing_rounds`), and the fastest is kept, a difference inside the
    measured noise going to the simpler plan; these steps train the model as
    any others (float32 runs the step `fit` traced). The decision stays within
    `auto.decision_seconds` (default a tenth of the whole fit, at most a fifth of
    the first epoch and 60 s), traces counted: where it cannot afford to trace
    the candidates, the simpler plan (float32) is kept. The
    plan is applied and training goes on.
    Where the device runs no 16-bit dtype fast (`hardware.is_fast`), nothing
    can be won: the model trains in float32 at once, nothing profiled or timed,
    and one line says so (`plan.metadata["measured"]` records the decision).
    With `auto.budget` a short Optuna search on `auto.x` and
    `auto.validation_data` decides instead (`callback.search_result`). A
    compact report says how many layers got each dtype, the predicted speedup
    and why the float32 layers stayed float32
    (`callback.plan.metadata["evidence"]`).

    Args:
        plan: a `PrecisionPlan`, the path of a plan JSON file, or `None` to
            profile, decide and apply automatically.
        hardware: `"local"` (this device: costs measured here) or a hardware
            profile name such as `"rtx4090"` or a `HardwareProfile` (costs
            predicted for it); also the device the guard promotes for.
        loss_scale: `"dynamic"` (`autoprec.LossScale()`: start at 2**15, halve
            on overflow down to a floor of 1, double after 2000 finite steps),
            an `autoprec.LossScale`, a number for a fixed scale, or `None` for
            no loss scaling (refused when a layer runs in float16, and with no
            plan, whose automatic plan may use float16).
        guard: an `autoprec.Guard`: check 16-bit kernels before training, watch
            for overflow during training and promote the layer where it starts;
            every promotion is logged and recorded in `plan.events`. `None`
            turns the guard and the kernel check off.
        auto: with no plan, an `autoprec.AutoPlan` (default `AutoPlan()`):
            profiling steps, batch size and the optional search.
        plan_path: if given, the plan as applied is saved there at the end of training.
        tensorboard_dir: if given, per-epoch loss scale and layer counts per dtype
            (scalars), the dtype of every layer and each event (text) are written
            to `<tensorboard_dir>/autoprec`, next to Keras' own TensorBoard logs.
        verbose: 1 shows one line when the plan is applied, each promotion, and
            with no plan the stages and a progress bar while costs are measured;
            0 is silent. Lines go to stdout while Keras' interactive logging is
            on, else to the `"autoprec"` logger.

    Example:

    ```python
    model.fit(x, y, epochs=2, callbacks=[autoprec.AutoPrecision()])  # decide automatically

    plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    guard = autoprec.Guard(on_nan="stop")
    model.fit(x, y, epochs=2, callbacks=[autoprec.AutoPrecision(plan, guard=guard)])
    ```
    """

    _decides_plan = True

    def __init__(
        self,
        plan: PrecisionPlan | str | os.PathLike | None = None,
        *,
        hardware: HardwareProfile | str = "local",
        loss_scale: LossScale | str | float | None = "dynamic",
        guard: Guard | None = DEFAULT_GUARD,
        auto: AutoPlan | None = None,
        plan_path: str | os.PathLike | None = None,
        tensorboard_dir: str | os.PathLike | None = None,
        verbose: int = 1,
    ) -> None:
        if plan is None and loss_scale is None:
            raise PlanError(
                "AutoPrecision: loss_scale=None needs an explicit plan without float16 layers; "
                "the automatic plan may use float16. Keep loss_scale='dynamic'."
            )
        super().__init__(
            plan,
            hardware=hardware,
            loss_scale=loss_scale,
            guard=guard,
            plan_path=plan_path,
            tensorboard_dir=tensorboard_dir,
            verbose=verbose,
        )
        if auto is not None and not isinstance(auto, AutoPlan):
            raise PlanError(
                f"AutoPrecision: auto must be an autoprec.AutoPlan or None, got {auto!r}; "
                "e.g. auto=autoprec.AutoPlan(profile_steps=10)."
            )
        if auto is not None and self.plan is not None:
            raise PlanError(
                "AutoPrecision: auto= sets how a plan is decided; pass it without a plan "
                "(AutoPrecision(auto=...)), or pass a plan without auto=."
            )
        self.auto = auto if auto is not None or self.plan is not None else AutoPlan()
        self.profile: Profile | None = None
        self.estimate: Estimate | None = None
        self.search_result: SearchResult | None = None
        self._profiler: ProfileCallback | None = None
        self._batch_reader: FirstBatchSize | None = None
        self._waiting_for_a_batch = False
        self._race: StepRace | None = None
        self._race_plans: dict[str, PrecisionPlan] = {}
        self._per_layer_plan: PrecisionPlan | None = None
        self._clock: StepClock | None = None
        self._decision: dict[str, Any] = {}

    # ------------------------------------------------------------------ Keras hooks

    def on_train_batch_begin(self, batch, logs=None) -> None:
        if self._race is not None:
            self._race.begin_step()

    def on_train_batch_end(self, batch, logs=None) -> None:
        if self._race is not None:
            self._step += 1
            steps = (self.params or {}).get("steps")
            last_of_epoch = steps is not None and batch + 1 >= steps
            # The timing stays inside the first epoch: a checkpoint written at its end
            # saves the plan kept, never a candidate still being timed.
            if self._race.end_step() or last_of_epoch:
                self._finish_race()
            return
        if self._profiler is None and not self._waiting_for_a_batch:
            super().on_train_batch_end(batch, logs)
            return
        self._step += 1
        if self._clock is not None:
            self._clock.step_ended()
        if self._profiler is not None:
            self._profiler.on_train_batch_end(batch, logs)
            if self._profiler.profile is not None:
                self._decide_and_apply()
            return
        steps = (self.params or {}).get("steps")
        last_of_epoch = steps is not None and batch + 1 >= steps
        if self._clock is None or self._clock.steps >= UNPROFILED_STEPS or last_of_epoch:
            self._decide_and_apply()

    def on_epoch_end(self, epoch, logs=None) -> None:
        if self._race is not None:
            self._finish_race()  # an epoch of unknown length ended while plans were timed
        super().on_epoch_end(epoch, logs)

    def on_train_end(self, logs=None) -> None:
        if self._profiler is not None or self._waiting_for_a_batch:
            self._decide_and_apply()  # training ended before the profile was complete
        if self._race is not None:
            self._finish_race()  # training ended while the candidate plans were timed
        super().on_train_end(logs)

    # ------------------------------------------------------------------ automatic mode

    def _start(self) -> None:
        if self.plan is not None:
            super()._start()
            return
        if self.auto.budget is None and not self._fast_reduced_dtypes():
            self._decide_at_once()
            return
        self._clock = StepClock()
        # fit's first batch gives the shapes costs are timed at (its size, unless
        # `AutoPlan(batch_size=...)` names another).
        self._batch_reader = FirstBatchSize(self.model)
        self._batch_reader.install()
        if self.auto.budget is None and not self._range_limited_dtypes():
            # bfloat16 keeps float32's exponent range: no recorded range can rule it out.
            self._waiting_for_a_batch = True
            show_message(
                "autoprec: bfloat16 keeps float32's range, nothing to profile; deciding after "
                f"{UNPROFILED_STEPS} steps",
                self.verbose,
            )
            return
        self._profiler = ProfileCallback(
            steps=self.auto.profile_steps, float8_ranges=self._float8_is_fast()
        )
        self._profiler.set_model(self.model)
        try:
            self._profiler.on_train_begin()
        except BackendError as error:
            self._profiler = None
            if self._batch_reader is None:
                show_message(
                    f"autoprec: no profile on this backend ({error}); deciding from costs",
                    self.verbose,
                )
                self._decide_and_apply()
            else:
                show_message(
                    f"autoprec: no profile on this backend ({error}); deciding from costs "
                    "after the first step",
                    self.verbose,
                )
                self._waiting_for_a_batch = True
            return
        show_message(
            f"autoprec: profiling the first {self.auto.profile_steps} steps in float32",
            self.verbose,
        )

    def _fast_reduced_dtypes(self) -> list[str]:
        """The 16-bit (and float8) dtypes the callback's device runs fast: what a plan can win with."""
        try:
            hardware = resolve_hardware(self.hardware)
        except Exception:  # noqa: BLE001 - an unknown device: profile and decide as before
            return [BFLOAT16]
        return [dtype for dtype in (BFLOAT16, FLOAT16, FLOAT8) if hardware.is_fast(dtype)]

    def _range_limited_dtypes(self) -> list[str]:
        """The fast dtypes a recorded range can rule out (float16, float8): what a profile decides."""
        return [dtype for dtype in self._fast_reduced_dtypes() if dtype in (FLOAT16, FLOAT8)]

    def _decide_at_once(self) -> None:
        """Keeps float32 without profiling or timing: no 16-bit dtype runs fast on the device."""
        started = time.perf_counter()
        device = resolve_hardware(self.hardware).name
        reason = f"no 16-bit dtype runs fast on {device}"
        plan = PrecisionPlan.uniform(self.model, FLOAT32)
        evidence = {path: {"reason": reason} for path in compute_layers(plan.layer_info)}
        self.plan = plan.with_metadata(
            hardware=device,
            predicted_speedup=None,
            evidence=evidence,
            measured={
                "decision_seconds": round(time.perf_counter() - started, 3),
                "candidates_timed": 0,
                "rounds": 0,
                "why": reason + ": nothing to win, nothing profiled or timed",
            },
        )
        self.estimate = None
        show_message(
            f"autoprec: {reason}: training in float32, the plan fit had "
            "(nothing profiled or timed)",
            self.verbose,
        )
        self._apply(quiet=True)

    def _decide_and_apply(self) -> None:
        self._waiting_for_a_batch = False
        if self._profiler is not None:
            if self._profiler.profile is None:
                self._profiler.remove_probes()
            self.profile = self._profiler.profile
            self._profiler = None
        batch_size, sample = self._first_batch()
        if self.auto.budget is not None:
            self.search_result = search_plan(
                self.model, self.auto, self.profile, self.hardware, batch_size
            )
            self.plan, self.estimate = self.search_result.plan, None
            self._apply(quiet=True)
            self._report()
            return
        decided_at = time.perf_counter()
        steps = (self.params or {}).get("steps")
        clock = self._clock or StepClock()
        epochs = (self.params or {}).get("epochs")
        budget = decision_budget(self.auto, clock.epoch_estimate(steps), epochs)
        trace = clock.trace_seconds() or 0.0
        # The race's traces come first (each fast uniform policy, the per-layer plan, the
        # kept plan's own; float32 runs fit's): per-layer costs are timed with what they leave.
        race_reserve = (len(self._fast_reduced_dtypes()) + 2) * trace
        plan, self.estimate = decide_plan(
            self.model,
            self.profile,
            hardware=self.hardware,
            batch_size=batch_size,
            verbose=self.verbose,
            sample=sample,
            time_budget=max(budget - race_reserve, 0.0),
            trace_seconds=trace,
        )
        spent = time.perf_counter() - decided_at
        self._decision = {"decision_seconds": spent, "budget_seconds": round(budget, 3)}
        self._race_or_apply(plan, spent, budget, trace)

    def _race_or_apply(
        self, plan: PrecisionPlan, spent: float, budget: float, trace: float
    ) -> None:
        """Starts timing the candidates inside fit where the budget pays their traces; else applies
        `plan` (the simpler one, float32, where the race was out of budget)."""
        optimizer = self.model.optimizer
        candidates = self._timed_candidates(plan)  # may add loss scaling for float16 ones
        reuse_fit_step = self.model.optimizer is optimizer
        traces = race_traces(self.model, candidates, reuse_fit_step) if len(candidates) > 1 else 0
        if traces and spent + traces * trace > budget:
            # The race's traces would not fit: out of budget, fit keeps the simpler plan.
            name, simpler = next(iter(candidates.items()))
            plan = simpler.with_metadata(hardware=plan.metadata.get("hardware"))
            why = (
                f"timing {len(candidates)} candidates needs {traces} traces of about "
                f"{trace:.1f} s, over the {budget:.1f} s budget: keeping {name}, the simpler plan"
            )
            self.estimate, candidates = None, {}
        else:
            why = ""
        if len(candidates) < 2:
            self.plan = plan.with_metadata(measured=self._decision_record(0, 0, why))
            self._apply(quiet=True)
            self._report()
            return
        candidates = self._checked(candidates)
        self._race_plans, self._per_layer_plan = candidates, plan
        self._race = StepRace(
            self.model, candidates, rounds=self.auto.timing_rounds, reuse_fit_step=reuse_fit_step
        )
        show_message(
            f"autoprec: timing the whole train step of {', '.join(candidates)} "
            "over the next steps of fit",
            self.verbose,
        )

    def _checked(self, candidates: dict[str, PrecisionPlan]) -> dict[str, PrecisionPlan]:
        """The race's candidates as the model runs them (checked once the race is on: the check
        calls each 16-bit layer, work the race would waste where it is not run)."""
        if self.guard is None or not self.guard.check_kernels:
            return candidates
        return {
            name: checked_plan(self.model, candidate, step=self._step)
            for name, candidate in candidates.items()
        }

    def _timed_candidates(self, plan: PrecisionPlan) -> dict[str, PrecisionPlan]:
        """The plans to time inside fit (none where costs are predicted, not measured here)."""
        if self.auto.timing_rounds == 0 or not is_local(self.hardware):
            return {}
        candidates = race_candidates(
            self.model, plan, self.profile, resolve_hardware(self.hardware)
        )
        if any(candidate.uses_float16 for candidate in candidates.values()):
            self._wrap_optimizer(uses_float16=True, has_16bit=True)  # float16 steps are scaled
        return candidates

    def _finish_race(self) -> None:
        """Keeps the plan whose whole step measured fastest, applies it and reports."""
        race, self._race = self._race, None
        result = race.result()
        race.close()
        self.plan = race_winner_plan(self._race_plans, result, self._per_layer_plan)
        self._decision["decision_seconds"] += result.added_seconds
        measured = dict(self.plan.metadata.get("measured") or {})
        measured.update(self._decision_record(len(self._race_plans), result.rounds_run))
        self.plan = self.plan.with_metadata(measured=measured)
        lines = race_lines(result, self.estimate)
        if self.plan.metadata.get("predicted_speedup") is None:
            self.estimate = None  # a uniform plan won: the estimate was the per-layer plan's
        self._apply(quiet=True)
        for line in lines:
            show_message(line, self.verbose)
        self._report()

    def _report(self) -> None:
        for line in report_lines(self.plan, self.estimate, self.handle.dtypes):
            show_message(line, self.verbose)
        measured = self.plan.metadata.get("measured") or {}
        if "decision_seconds" in measured and "budget_seconds" in measured:
            timed = measured.get("candidates_timed", 0)
            show_message(
                f"autoprec: deciding took {measured['decision_seconds']:.1f} s (budget "
                f"{measured['budget_seconds']:.1f} s): {timed} candidate(s) timed in "
                f"{measured.get('rounds', 0)} round(s)"
                + (f", {measured['traces']} traced" if "traces" in measured else "")
                + (f"; {measured['why']}" if measured.get("why") else ""),
                self.verbose,
            )

    def _decision_record(self, candidates: int, rounds: int, why: str = "") -> dict[str, Any]:
        """What the decision cost, for `plan.metadata["measured"]`."""
        record = {
            "decision_seconds": round(float(self._decision.get("decision_seconds", 0.0)), 3),
            "budget_seconds": self._decision.get("budget_seconds"),
            "candidates_timed": candidates,
            "rounds": rounds,
        }
        if why:
            record["why"] = why
        return record

    def _first_batch(self) -> tuple[int, Any]:
        """Returns the batch size to time costs at (`auto.batch_size`, else fit's first batch's) and
        inputs of that many samples shaped as fit's first batch (`None` when none was read)."""
        reader, self._batch_reader = self._batch_reader, None
        size = reader.read() if reader is not None else None
        size = self.auto.batch_size or size
        sample = reader.read_inputs(size) if reader is not None else None
        if reader is not None:
            # The traced step keeps the reader (it records one batch, once): a plan that
            # changes nothing runs it on; one that does, and the race, trace their own.
            reader.remove()
        if size is None:
            logger.info(
                "autoprec: no batch seen before deciding; costs timed at batch size %d",
                FALLBACK_BATCH_SIZE,
            )
            return FALLBACK_BATCH_SIZE, None
        return size, sample
