"""`AutoPrecision`: the Keras callback that trains a model with a per-layer precision plan."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import keras

from ._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32, count_dtypes, counts_text
from ._core.models import show_message
from .cost import Estimate
from .decision import (
    FALLBACK_BATCH_SIZE,
    UNPROFILED_STEPS,
    AutoPlan,
    FirstBatchSize,
    StepClock,
    best_predicted_speedup,
    decide_plan,
    decision_budget,
    memory,
    race_budget,
    race_candidates,
    race_lines,
    race_traces,
    race_winner_plan,
    report_lines,
)
from .decision.race import StepRace
from .errors import BackendError, PlanError
from .hardware import HardwareProfile, is_local, resolve_hardware
from .plan import PrecisionPlan
from .profiler import Profile, ProfileCallback
from .runtime.guard import Guard
from .runtime.kernels import checked_plan
from .runtime.loss_scale import LossScale
from .runtime.telemetry import installed_telemetry
from .runtime.training import DEFAULT_GUARD, PlanCallback
from .search import SearchResult, SearchSettings, compute_layers, search

logger = logging.getLogger("autoprec")

#: The most steps of the plan kept that are timed for the memory of decisions.
KEPT_STEPS = 50


class AutoPrecision(PlanCallback):
    """Trains with a per-layer precision plan, adding loss scaling whenever a layer runs in float16.

    With a plan it behaves as `autoprec.runtime.PlanCallback`, which it extends:
    the plan is applied to every layer at the start of training, the optimizer
    is wrapped in a `FlooredLossScaleOptimizer` when a layer computes in float16,
    and the plan stays applied after training (`restore()` undoes it). The plan
    must fit the model exactly: to train with the part of a plan that fits, pass
    `autoprec.apply_plan(model, plan, strict=False).plan`.

    With no plan it decides one itself (settings in `auto`, an
    `autoprec.AutoPlan`): it profiles the first steps of `fit`, builds the
    heuristic plan from the recorded ranges and the layer costs at the batch size
    `fit` uses (measured here, or predicted for `hardware`), and where costs are
    measured here times the whole train step of float32, the uniform 16-bit
    policies the device runs fast and that plan inside the next steps of `fit`,
    keeping the fastest, within `auto.decision_seconds`. Where no 16-bit dtype
    runs fast, it trains in float32 at once; with `auto.budget` a short Optuna
    search decides instead (`callback.search_result`). A compact report says
    what each layer got and why (`callback.plan.metadata`); docs/api.md says
    how in full.

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
        self._deciding: _Deciding | None = None  # set while the automatic mode decides
        self._epoch = 0
        self._memory_key: dict | None = None  # where the plan this fit ends with is stored
        self._recalled: dict | None = None  # the stored decision applied, until it is checked
        self._kept_clock: StepClock | None = None  # the steps run in the plan decided
        self._batch_signature: list | None = None
        self._menu: tuple[HardwareProfile | None, list[str]] = (None, [])
        self._afresh = ""  # why a recalled plan was decided afresh

    # ------------------------------------------------------------------ Keras hooks

    def on_train_batch_begin(self, batch, logs=None) -> None:
        if self._deciding is not None and self._deciding.race is not None:
            self._deciding.race.begin_step()

    def on_train_batch_end(self, batch, logs=None) -> None:
        deciding = self._deciding
        if deciding is None:
            super().on_train_batch_end(batch, logs)
            if self._kept_clock is not None and self._kept_clock.steps <= KEPT_STEPS:
                self._kept_clock.step_ended()
                if self._recalled is not None:
                    self._check_recalled()
            return
        self._step += 1
        steps = (self.params or {}).get("steps")
        last_of_epoch = steps is not None and batch + 1 >= steps
        if deciding.race is not None:
            # The race may run on into the next epoch; it ends inside the last one.
            if deciding.race.end_step() or (last_of_epoch and self._last_epoch()):
                self._finish_race()
            return
        deciding.clock.step_ended()
        if deciding.profiler is not None:
            deciding.profiler.on_train_batch_end(batch, logs)
            if deciding.profiler.profile is not None:
                self._decide_and_apply()
        elif deciding.clock.steps >= UNPROFILED_STEPS or last_of_epoch:
            self._decide_and_apply()

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self._epoch = epoch
        super().on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch, logs=None) -> None:
        if self._deciding is not None and self._deciding.race is not None and self._last_epoch():
            self._finish_race()  # the last epoch ended while plans were timed
        super().on_epoch_end(epoch, logs)

    def _last_epoch(self) -> bool:
        return self._epoch + 1 >= (self.params or {}).get("epochs", 1)

    def on_train_end(self, logs=None) -> None:
        if self._deciding is not None and self._deciding.race is None:
            self._decide_and_apply()  # training ended before the profile was complete
        if self._deciding is not None:
            self._finish_race()  # training ended while the candidate plans were timed
        super().on_train_end(logs)
        if self._memory_key is not None and self.plan is not None:
            steps = self._kept_clock.intervals() if self._kept_clock is not None else []
            memory.remember(self._memory_key, self.current_plan(), self._batch_signature, steps)

    # ------------------------------------------------------------------ automatic mode

    def _start(self) -> None:
        if self.plan is not None:
            super()._start()
            return
        try:
            device = resolve_hardware(self.hardware)  # once for the fit
            fast = [dtype for dtype in (BFLOAT16, FLOAT16, FLOAT8) if device.is_fast(dtype)]
        except Exception:  # noqa: BLE001 - an unknown device: profile and decide as before
            device, fast = None, [BFLOAT16]
        if self.auto.budget is None and not fast:
            self._decide_at_once(device)
            return
        self._menu = (device, fast)
        if self.auto.remember and device is not None:
            self._memory_key = memory.decision_key(self.model, device.name, fast, self.auto)
            entry = memory.recall(self._memory_key)
            if entry is not None:
                self._recall(entry)
                return
        self._start_deciding(device, fast)

    def _start_deciding(self, device: HardwareProfile | None, fast: list[str]) -> None:
        """Starts the first batch's reader (the shapes costs are timed at), then the profile."""
        reader = FirstBatchSize(self.model)
        reader.install()
        deciding = self._deciding = _Deciding(device, fast, reader)
        if self.auto.budget is None and not {FLOAT16, FLOAT8} & set(fast):
            # bfloat16 keeps float32's exponent range: no recorded range can rule it out.
            show_message(
                "autoprec: bfloat16 keeps float32's range, nothing to profile; deciding after "
                f"{UNPROFILED_STEPS} steps",
                self.verbose,
            )
            return
        profiler = ProfileCallback(steps=self.auto.profile_steps, float8_ranges=FLOAT8 in fast)
        profiler.set_model(self.model)
        try:
            profiler.on_train_begin()
        except BackendError as error:
            show_message(
                f"autoprec: no profile on this backend ({error}); deciding from costs "
                "after the first step",
                self.verbose,
            )
            return
        deciding.profiler = profiler
        show_message(
            f"autoprec: profiling the first {self.auto.profile_steps} steps in float32",
            self.verbose,
        )

    def _recall(self, entry: dict) -> None:
        """Applies the plan stored for this model, device and menu from the next step on."""
        self._recalled = dict(entry, reader=FirstBatchSize(self.model))
        self._recalled["reader"].install()
        recalled = {"step_ms": entry["step_ms"], "checked_ms": None}
        self.plan, self.estimate = _with_measured(entry["plan"], recalled=recalled), None
        self._apply(quiet=True)
        self._kept_clock = StepClock()
        logger.info(
            "autoprec: recalled the plan decided before for this model and device (%s; "
            "%s ms a step stored): nothing profiled or timed, its step time checked after "
            "%d steps; AutoPlan(remember=False) or deleting %s forgets it",
            counts_text(count_dtypes(self.handle.dtypes.values())),
            entry["step_ms"],
            memory.RECALL_CHECK_STEPS,
            memory.memory_dir(),
        )

    def _check_recalled(self) -> None:
        """Decides afresh where the first batch or the step time differs from the stored ones."""
        entry, clock = self._recalled, self._kept_clock
        why = ""
        if clock.steps == 1:
            self._batch_signature = entry["reader"].signature()
            entry["reader"].remove()
            if self._batch_signature != entry["batch"]:
                why = f"the first batch {self._batch_signature} is not {entry['batch']}, stored"
        elif clock.steps > memory.RECALL_CHECK_STEPS:
            self._recalled = None
            why = memory.drifted(entry, clock.step_seconds())
            if not why:
                checked = round(1e3 * clock.step_seconds(), 4)
                recalled = {"step_ms": entry["step_ms"], "checked_ms": checked}
                self.plan = _with_measured(self.plan, recalled=recalled)
        if why:
            logger.info("autoprec: deciding afresh: %s", why)
            self._recalled, self._kept_clock, self._afresh = None, None, why
            self.restore()
            self.handle, self.plan = None, None
            self._start_deciding(*self._menu)

    def _decide_at_once(self, device: HardwareProfile) -> None:
        """Keeps float32 without profiling or timing: no 16-bit dtype runs fast on the device."""
        started = time.perf_counter()
        reason = f"no 16-bit dtype runs fast on {device.name}"
        plan = PrecisionPlan.uniform(self.model, FLOAT32)
        evidence = {path: {"reason": reason} for path in compute_layers(plan.layer_info)}
        self.plan = plan.with_metadata(
            hardware=device.name,
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
        deciding, self._deciding = self._deciding, None
        if deciding.profiler is not None:
            if deciding.profiler.profile is None:
                deciding.profiler.remove_probes()
            self.profile = deciding.profiler.profile
        self._batch_signature = deciding.batch_reader.signature()
        batch_size, sample = self._first_batch(deciding.batch_reader)
        hardware = deciding.device or self.hardware  # an unknown name raises its error here
        if self.auto.budget is not None:
            self.search_result = search(
                self.model,
                self.auto.x,
                self.auto.validation_data,
                budget=self.auto.budget,
                hardware=hardware,
                n_trials=self.auto.n_trials,
                verbose=0,
                settings=SearchSettings(profile=self.profile, batch_size=batch_size),
            )
            self.plan, self.estimate = self.search_result.plan, None
            self._apply(quiet=True)
            self._report()
            return
        decided_at = time.perf_counter()
        budget = decision_budget(self.auto, deciding.clock.fit_estimate(self._fit_steps()))
        trace = deciding.clock.trace_seconds() or 0.0
        # With decision_seconds the race's traces come out of it too (each fast uniform policy
        # and the per-layer plan; float32 runs on fit's trace; the plan kept runs on its race
        # trace): per-layer costs are timed with what they leave.
        shared = self.auto.decision_seconds is not None
        race_reserve = (len(deciding.fast) + 1) * trace if shared else 0.0
        plan, self.estimate = decide_plan(
            self.model,
            self.profile,
            hardware=hardware,
            batch_size=batch_size,
            verbose=self.verbose,
            sample=sample,
            time_budget=max(budget - race_reserve, 0.0),
            trace_seconds=trace,
        )
        deciding.decision_seconds = time.perf_counter() - decided_at
        deciding.budget_seconds = round(budget, 3)
        self._race_or_apply(deciding, plan, trace)

    def _fit_steps(self, left: bool = False) -> int | None:
        """Returns the steps of the whole fit (epochs x steps per epoch), or those still to run."""
        params = self.params or {}
        if not params.get("steps") or not params.get("epochs"):
            return None
        return params["steps"] * params["epochs"] - (self._step if left else 0)

    def _race_or_apply(self, deciding: _Deciding, plan: PrecisionPlan, trace: float) -> None:
        """Starts timing the candidates inside fit where the gain pays their traces; else applies."""
        optimizer = self.model.optimizer
        candidates = self._timed_candidates(deciding.device, plan)  # may add loss scaling
        # A TensorFlow trace holds the optimizer it traced, which the guard's wraps (one state);
        # JAX's fit passes in the optimizer's variables, a list the wrapper changes.
        tensorflow = keras.backend.backend() == "tensorflow"
        reuse_fit_step = self.model.optimizer is optimizer or tensorflow
        traces = race_traces(self.model, candidates, reuse_fit_step) if len(candidates) > 1 else 0
        allowed, because = race_budget(
            self.auto,
            deciding.clock.step_seconds(),
            best_predicted_speedup(plan),
            self._fit_steps(left=True),
            deciding.budget_seconds - deciding.decision_seconds,
            rated_only=_rated_only(deciding.device, plan),
        )
        deciding.race_budget_seconds = round(allowed, 3)
        why = ""
        if traces and traces * trace > allowed:
            # The race's traces would not pay: out of budget, fit keeps the simpler plan.
            name, simpler = next(iter(candidates.items()))
            plan = simpler.with_metadata(hardware=plan.metadata.get("hardware"))
            why = (
                f"timing {len(candidates)} candidates needs {traces} trace(s) of about "
                f"{trace:.1f} s, over the {allowed:.1f} s budget: keeping {name}, the simpler "
                f"plan (the race's budget: {because})"
            )
            self.estimate, candidates = None, {}
        if len(candidates) < 2:
            self.plan = plan.with_metadata(measured=deciding.measured(0, 0, why))
            self._apply(quiet=True)
            self._report()
            return
        deciding.race_plans, deciding.per_layer_plan = self._checked(candidates), plan
        deciding.race = StepRace(
            self.model,
            deciding.race_plans,
            rounds=self.auto.timing_rounds,
            reuse_fit_step=reuse_fit_step,
        )
        self._deciding = deciding
        show_message(
            f"autoprec: timing the whole train step of {', '.join(candidates)} "
            "over the next steps of fit",
            self.verbose,
        )

    def _checked(self, candidates: dict[str, PrecisionPlan]) -> dict[str, PrecisionPlan]:
        """The race's candidates as the model runs them (kernels checked once the race is on)."""
        if self.guard is None or not self.guard.check_kernels:
            return candidates
        return {
            name: checked_plan(self.model, candidate, step=self._step)
            for name, candidate in candidates.items()
        }

    def _timed_candidates(
        self, device: HardwareProfile | None, plan: PrecisionPlan
    ) -> dict[str, PrecisionPlan]:
        """The plans to time inside fit (none where costs are predicted, not measured here)."""
        if self.auto.timing_rounds == 0 or device is None or not is_local(device):
            return {}
        candidates = race_candidates(self.model, plan, self.profile, device)
        float16 = any(candidate.uses_float16 for candidate in candidates.values())
        # Candidates besides float32 differ from it (`race_candidates` keeps each once): 16-bit.
        if len(candidates) > 1 and (float16 or self.guard is not None):
            # The race times the steps the epochs run: float16 scaled, skipped steps kept.
            self._wrap_optimizer(uses_float16=float16, has_16bit=True, plan=plan)
            self._install_telemetry(has_16bit=True)
        return candidates

    def _finish_race(self) -> None:
        """Keeps the plan whose whole step measured fastest, applies it and reports."""
        deciding, self._deciding = self._deciding, None
        result = deciding.race.result()
        self.plan = race_winner_plan(deciding.race_plans, result, deciding.per_layer_plan)
        if deciding.race.ran_on_fit_step(result.winner):
            self._unwrap_optimizer()  # fit's own step runs on, with the optimizer it traced
        keeping = installed_telemetry(self.model)
        self._raced = [
            (dtypes, function, self.model.optimizer, keeping)
            for dtypes, function in deciding.race.traced_functions()
        ]
        deciding.race.close()
        deciding.decision_seconds += result.added_seconds
        measured = deciding.measured(len(deciding.race_plans), result.rounds_run)
        self.plan = _with_measured(self.plan, **measured)
        lines = race_lines(result, self.estimate)
        if self.plan.metadata.get("predicted_speedup") is None:
            self.estimate = None  # a uniform plan won: the estimate was the per-layer plan's
        self._apply(quiet=True)
        for line in lines:
            show_message(line, self.verbose)
        self._report()

    def _report(self) -> None:
        """Reports the plan decided, and starts timing the steps it runs (for the memory)."""
        self._kept_clock = StepClock()
        if self._afresh:
            self.plan = _with_measured(self.plan, recalled={"afresh": self._afresh})
            self._afresh = ""
        for line in report_lines(self.plan, self.estimate, self.handle.dtypes):
            show_message(line, self.verbose)
        measured = self.plan.metadata.get("measured") or {}
        if "decision_seconds" in measured and "budget_seconds" in measured:
            show_message(
                f"autoprec: deciding took {measured['decision_seconds']:.1f} s (budget "
                f"{measured['budget_seconds']:.1f} s): {measured.get('candidates_timed', 0)} "
                f"candidate(s) timed in {measured.get('rounds', 0)} round(s)"
                + (f", {measured['traces']} traced" if "traces" in measured else "")
                + (f"; {measured['why']}" if measured.get("why") else ""),
                self.verbose,
            )

    def _first_batch(self, reader: FirstBatchSize) -> tuple[int, Any]:
        """Returns the batch size to time costs at and inputs shaped as fit's first batch (or `None`)."""
        size = self.auto.batch_size or reader.read()
        sample = reader.read_inputs(size)
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


@dataclasses.dataclass
class _Deciding:
    """What the automatic mode holds while it decides (racing once `race` is set)."""

    device: HardwareProfile | None  # `hardware=` resolved for this fit; None: an unknown device
    fast: list[str]  # the 16-bit (and float8) dtypes the device runs fast: what a plan can win
    batch_reader: FirstBatchSize
    clock: StepClock = dataclasses.field(default_factory=StepClock)
    profiler: ProfileCallback | None = None
    race: StepRace | None = None
    race_plans: dict[str, PrecisionPlan] = dataclasses.field(default_factory=dict)
    per_layer_plan: PrecisionPlan | None = None
    decision_seconds: float = 0.0
    budget_seconds: float = 0.0
    race_budget_seconds: float | None = None

    def measured(self, candidates: int, rounds: int, why: str = "") -> dict[str, Any]:
        """What the decision cost, for `plan.metadata["measured"]`."""
        return {
            "decision_seconds": round(self.decision_seconds, 3),
            "budget_seconds": self.budget_seconds,
            "race_budget_seconds": self.race_budget_seconds,
            "candidates_timed": candidates,
            "rounds": rounds,
            **({"why": why} if why else {}),
        }


def _rated_only(device: HardwareProfile | None, plan: PrecisionPlan) -> bool:
    """Whether the plan's predicted gain comes from a CPU's rated peaks, not from timed costs."""
    start = plan.metadata.get("start")
    costs = str(start.get("costs", "")) if isinstance(start, Mapping) else ""
    return device is not None and device.kind == "cpu" and costs.startswith("predicted")


def _with_measured(plan: PrecisionPlan, **values: Any) -> PrecisionPlan:
    """Returns `plan` with `values` added to `metadata["measured"]`."""
    return plan.with_metadata(measured={**(plan.metadata.get("measured") or {}), **values})
