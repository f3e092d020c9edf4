"""Whole train steps timed inside `fit`: the plans raced, the race, its report and the plan kept."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import keras

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32, policy_name
from .._core.models import rebuild_train_function, sync_fit_state
from .._core.timing import RoundsVerdict, judge_rounds, rotated, wants_more_rounds
from ..cost import Estimate
from ..hardware import HardwareProfile
from ..layers import layer_paths, layer_policy
from ..plan import PrecisionPlan
from ..profiler import Profile
from ..runtime.apply import apply_plan
from ..runtime.float8 import (
    extend_optimizer,
    float8_state,
    float8_variables,
    put_float8_state,
    sync_float8_variables,
)
from ..search import (
    float8_unsafe_layers,
    float16_unsafe_layers,
    has_classification_loss,
    output_layers,
)

#: The name of the per-layer plan among the plans timed inside `fit`.
PER_LAYER = "per-layer"


def race_candidates(
    model: keras.Model,
    plan: PrecisionPlan,
    profile: Profile | None,
    hardware: HardwareProfile,
) -> dict[str, PrecisionPlan]:
    """Returns the plans whose whole step the one-liner times, simplest first, each once."""
    candidates = {FLOAT32: PrecisionPlan.uniform(model, FLOAT32)}
    outputs = () if has_classification_loss(model) else output_layers(model, plan.layer_info)
    for dtype in (BFLOAT16, FLOAT16):
        if not hardware.is_fast(dtype):
            continue
        if dtype == FLOAT16 and (profile is None or float16_unsafe_layers(profile)):
            continue
        uniform = PrecisionPlan.uniform(model, dtype)
        for path in sorted(outputs):
            uniform = uniform.with_dtype(path, FLOAT32)
        candidates[f"mixed_{dtype}"] = uniform
    if hardware.is_fast(FLOAT8) and hardware.is_fast(BFLOAT16):
        # Float8 wherever Keras allows it, output layers and float8-unsafe layers excepted.
        uniform = PrecisionPlan.uniform(model, FLOAT8)
        refused = {*output_layers(model, plan.layer_info), *float8_unsafe_layers(profile)}
        for path in sorted(path for path in refused if uniform.layers.get(path) == FLOAT8):
            uniform = uniform.with_dtype(path, BFLOAT16)
        candidates["float8"] = uniform
    candidates[PER_LAYER] = plan
    unique: dict[tuple, tuple[str, PrecisionPlan]] = {}
    for name, candidate in candidates.items():
        unique.setdefault(tuple(sorted(candidate.resolve().items())), (name, candidate))
    return dict(unique.values())


def race_traces(
    model: keras.Model, candidates: Mapping[str, PrecisionPlan], reuse_fit_step: bool = True
) -> int:
    """Returns how many train steps timing `candidates` inside `fit` traces: one per candidate
    whose dtypes differ from what fit traced (every one when fit's trace is stale)."""
    running = {
        path: layer_policy(layer).compute_dtype for path, layer in layer_paths(model).items()
    }
    return sum(
        not reuse_fit_step
        or any(running.get(path) != dtype for path, dtype in candidate.resolve().items())
        for candidate in candidates.values()
    )


def race_lines(result: RaceResult, estimate: Estimate | None) -> list[str]:
    """Returns the report of the whole steps timed inside `fit`: what was timed and what it chose."""
    verdict = result.verdict
    timed = (
        f"autoprec: timed the whole train step of {', '.join(result.rounds)} inside fit "
        f"({result.rounds_run} interleaved round(s) of 2 steps; {result.steps} steps, "
        f"+{result.added_seconds:.1f} s over the chosen plan's pace)"
    )
    if verdict is None:
        return [
            timed,
            "  the first epoch ended before every plan was timed: keeping the per-layer plan",
        ]
    medians = verdict.medians
    figures = ", ".join(f"{name} {1e3 * medians[name]:.2f} ms" for name in medians)
    predicted = (
        f"; predicted {estimate.speedup:.2f}x"
        if estimate is not None and estimate.speedup and PER_LAYER in medians
        else ""
    )
    leader = verdict.leader
    chosen = f"keeping {leader}"
    if leader != FLOAT32:
        chosen += f" ({medians[FLOAT32] / medians[leader]:.2f}x float32)"
    if verdict.fastest != leader:
        noise = verdict.comparisons[leader].noise
        chosen += (
            f"; {verdict.fastest} was {medians[leader] / medians[verdict.fastest]:.2f}x "
            f"faster, inside the measured noise ({1e3 * noise:.2f} ms)"
        )
    return [timed, f"  median step: {figures}{predicted}; {chosen}"]


def race_winner_plan(
    candidates: Mapping[str, PrecisionPlan], result: RaceResult, per_layer: PrecisionPlan
) -> PrecisionPlan:
    """Returns the plan the timing chose, its measurement recorded in `metadata["measured"]`."""
    name = result.winner or PER_LAYER
    measured = result.to_dict()
    if name == PER_LAYER:
        return per_layer.with_metadata(measured=measured)
    return candidates[name].with_metadata(
        hardware=per_layer.metadata.get("hardware"),
        predicted_speedup=None,
        evidence={},
        measured=measured,
    )


@dataclasses.dataclass(frozen=True)
class RaceResult:
    """What the timed steps inside `fit` measured, and the plan they chose."""

    verdict: RoundsVerdict | None
    rounds: Mapping[str, tuple[float, ...]]
    steps: int
    rounds_run: int
    seconds: float
    added_seconds: float
    traces: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Returns the result as JSON-ready values (milliseconds), for `plan.metadata["measured"]`."""
        record: dict[str, Any] = {
            "what": "whole train step inside fit, candidate plans interleaved",
            "steps": self.steps,
            "rounds": self.rounds_run,
            "traces": self.traces,
            "seconds": round(self.seconds, 4),
            "added_seconds": round(self.added_seconds, 4),
            "rounds_ms": {
                name: [round(1e3 * value, 4) for value in figures]
                for name, figures in self.rounds.items()
            },
        }
        if self.verdict is not None:
            record.update(
                winner=self.verdict.leader,
                fastest=self.verdict.fastest,
                verdict=self.verdict.verdict,
                median_ms={k: round(1e3 * v, 4) for k, v in self.verdict.medians.items()},
                min_ms={k: round(1e3 * min(v), 4) for k, v in self.rounds.items()},
                noise_ms={
                    name: round(1e3 * comparison.noise, 4)
                    for name, comparison in self.verdict.comparisons.items()
                },
            )
        return record

    @property
    def winner(self) -> str | None:
        """The plan the rounds chose, or `None` without a verdict."""
        return self.verdict.leader if self.verdict is not None else None


@dataclasses.dataclass
class _Candidate:
    name: str
    plan: PrecisionPlan
    dtypes: dict[str, str] | None = None
    train_function: Callable[..., Any] | None = None
    first_step: float | None = None


class StepRace:
    """Times candidate plans' train steps inside `fit` (`begin_step`/`end_step` around each)."""

    def __init__(
        self,
        model: keras.Model,
        candidates: Mapping[str, PrecisionPlan],
        rounds: int = 5,
        steps_per_round: int = 2,
        max_rounds: int = 9,
        reuse_fit_step: bool = True,
    ) -> None:
        if not candidates:
            raise ValueError("StepRace: no candidate plans to time.")
        self.model = model
        self.candidates = [_Candidate(name, plan) for name, plan in candidates.items()]
        self.rounds = rounds
        self.steps_per_round = steps_per_round
        self.max_rounds = max(max_rounds, rounds)
        self._paths = layer_paths(model)
        self._original = {path: layer_policy(layer) for path, layer in self._paths.items()}
        # fit's own train function, traced for the policies in `_original` (read at the
        # first step: fit builds it after a race made before fit); None once stale.
        self._fit_function: Callable[..., Any] | None = None
        self._fit_function_stale = not reuse_fit_step
        self._float8_layers: list[keras.layers.Layer] = []
        self._float8_saved: dict[int, list] = {}
        self._prepare_float8()
        self._traces = 0
        count = len(self.candidates)
        self._schedule = [(i, False) for i in range(count) for _ in range(1 + steps_per_round)]
        self._schedule += [step for number in range(rounds) for step in self._round(number)]
        self._position = 0
        self._rounds_run = 0
        self._timed: list[list[float]] = [[] for _ in self.candidates]
        self._round_steps: list[list[float]] = [[] for _ in self.candidates]
        self._current: int | None = None
        self._started: float | None = None
        self._first_begin: float | None = None
        self._last_end: float | None = None
        self._steps = 0
        self.finished = False  # every scheduled step ran and the verdict is read

    def begin_step(self) -> None:
        """Switches to the next scheduled candidate and starts the step's clock."""
        if self.finished:
            return
        now = time.perf_counter()
        if self._first_begin is None:
            self._first_begin = now
            if not self._fit_function_stale:
                self._fit_function = self.model.train_function
        index, _ = self._schedule[self._position]
        if index != self._current:
            self._use(index)
            self._current = index
        self._started = time.perf_counter()

    def end_step(self) -> bool:
        """Stops the step's clock and records it; returns whether the race is over."""
        if self.finished or self._started is None:
            return self.finished
        self._last_end = time.perf_counter()
        seconds, self._started = self._last_end - self._started, None
        self._steps += 1
        index, timed = self._schedule[self._position]
        candidate = self.candidates[index]
        if candidate.first_step is None:
            candidate.first_step = seconds
        if timed:
            self._round_steps[index].append(seconds)
            if len(self._round_steps[index]) == self.steps_per_round:
                self._timed[index].append(sum(self._round_steps[index]) / self.steps_per_round)
                self._round_steps[index] = []
                if all(len(figures) > self._rounds_run for figures in self._timed):
                    self._rounds_run += 1
        self._position += 1
        if self._position == len(self._schedule):
            verdict = self._verdict()
            if verdict is not None and wants_more_rounds(verdict, self.max_rounds):
                self._schedule += self._round(self._rounds_run)
            else:
                self.finished = True
        return self.finished

    def result(self) -> RaceResult:
        """Returns what was measured so far, with the verdict when every plan has a round."""
        verdict = self._verdict()
        seconds = self._last_end - self._first_begin if self._last_end is not None else 0.0
        added = 0.0
        if verdict is not None:
            winner = next(c for c in self.candidates if c.name == verdict.leader)
            added = seconds - (self._steps - 1) * verdict.medians[verdict.leader]
            added -= winner.first_step or 0.0
        return RaceResult(
            verdict=verdict,
            rounds={
                candidate.name: tuple(figures)
                for candidate, figures in zip(self.candidates, self._timed)
            },
            steps=self._steps,
            rounds_run=self._rounds_run,
            seconds=seconds,
            added_seconds=max(added, 0.0),
            traces=self._traces,
        )

    def ran_on_fit_step(self, name: str | None) -> bool:
        """Whether the candidate `name` ran on fit's own train function (it changes no policy)."""
        return any(
            c.name == name and c.train_function is self._fit_function is not None
            for c in self.candidates
        )

    def traced_functions(self) -> list[tuple[dict[str, str], Callable[..., Any]]]:
        """Returns `(dtypes, train function)` of each candidate the race ran."""
        return [
            (candidate.dtypes, candidate.train_function)
            for candidate in self.candidates
            if candidate.dtypes is not None and candidate.train_function is not None
        ]

    def close(self) -> None:
        """Puts back the layers' policies from before the race and a train function running them."""
        self._restore_policies()
        if self._current is not None:  # a candidate's train function is in place
            if self._fit_function is not None:
                self.model.train_function = self._fit_function
            else:  # float8 candidates extended the optimizer: fit's own trace is stale
                rebuild_train_function(self.model)
        self._current = None
        self.finished = True

    # ------------------------------------------------------------------ internals

    def _round(self, round_index: int) -> list[tuple[int, bool]]:
        order = rotated(range(len(self.candidates)), round_index)
        return [(index, True) for index in order for _ in range(self.steps_per_round)]

    def _verdict(self) -> RoundsVerdict | None:
        if any(not figures for figures in self._timed):
            return None
        rounds = {c.name: figures for c, figures in zip(self.candidates, self._timed)}
        order = [candidate.name for candidate in self.candidates]
        return judge_rounds(rounds, order.index)

    def _prepare_float8(self) -> None:
        """Creates the float8 candidates' scaling variables and an optimizer knowing them."""
        float8_plans = [c.plan for c in self.candidates if c.plan.uses_float8]
        if not float8_plans:
            return
        for plan in float8_plans:
            apply_plan(self.model, plan, strict=True)
        self._float8_layers = [layer for layer in self._paths.values() if float8_variables(layer)]
        for variable_layer in self._paths.values():
            for variable in float8_variables(variable_layer):
                variable.trainable = True
        extend_optimizer(self.model)
        self._fit_function_stale = True  # traced with the optimizer before it was extended
        self._restore_policies()

    def _keep_float8_state(self, index: int) -> None:
        """Saves the float8 scales of the candidate left and puts back those of the one entered."""
        if not self._float8_layers:
            return
        sync_fit_state(self.model)
        current = self._current
        if current is not None and self.candidates[current].plan.uses_float8:
            self._float8_saved[current] = float8_state(self._float8_layers)
        if index in self._float8_saved:
            put_float8_state(self._float8_saved[index])

    def _policies_unchanged(self) -> bool:
        return all(
            layer_policy(layer).name == self._original[path].name
            for path, layer in self._paths.items()
            if path in self._original
        )

    def _restore_policies(self) -> None:
        for path, policy in self._original.items():
            layer = self._paths.get(path)
            if layer is not None:
                layer.dtype_policy = policy
        sync_float8_variables(self._paths.values())

    def _use(self, index: int) -> None:
        """Runs the candidate's plan from the next step: its own traced train function."""
        self._keep_float8_state(index)
        candidate = self.candidates[index]
        if candidate.train_function is None:
            handle = apply_plan(self.model, candidate.plan, strict=True)
            if extend_optimizer(self.model):
                # New float8 variables, a new optimizer: the functions traced with the old
                # one would train with stale state, so every other candidate traces again.
                for other in self.candidates:
                    other.train_function = None
                self._fit_function, self._fit_function_stale = None, True
            candidate.dtypes = dict(handle.dtypes)
            if self._fit_function is not None and self._policies_unchanged():
                self.model.train_function = self._fit_function  # fit's own trace runs it
            else:
                rebuild_train_function(self.model)
                self._traces += 1
            candidate.train_function = self.model.train_function
            return
        source = candidate.plan.float8_source
        layers = []
        for path, dtype in candidate.dtypes.items():
            layer = self._paths.get(path)
            if layer is not None:
                layer.dtype_policy = policy_name(dtype, source)
                layers.append(layer)
        sync_float8_variables(layers)
        self.model.train_function = candidate.train_function


#: Steps `fit` runs before an unprofiled decision: the first (its trace) and two that time a step.
UNPROFILED_STEPS = 3


@dataclasses.dataclass
class StepClock:
    """Records when each of `fit`'s first steps ended, from the start of training."""

    started: float = dataclasses.field(default_factory=time.perf_counter)
    ends: list[float] = dataclasses.field(default_factory=list)

    def step_ended(self) -> None:
        """Records the end of one more step."""
        self.ends.append(time.perf_counter() - self.started)

    @property
    def steps(self) -> int:
        """Steps recorded."""
        return len(self.ends)

    def intervals(self) -> list[float]:
        """Returns the seconds of each step after the first (traced) one."""
        return [b - a for a, b in zip(self.ends, self.ends[1:])]

    def step_seconds(self) -> float | None:
        """Returns the median seconds of a step after the first (traced) one, or `None`."""
        return statistics.median(self.intervals()) if len(self.ends) > 1 else None

    def trace_seconds(self) -> float | None:
        """Returns what tracing the train step cost: the first step less a later one's time."""
        return max(self.ends[0] - (self.step_seconds() or 0.0), 0.0) if self.ends else None

    def fit_estimate(self, steps: int | None) -> float | None:
        """Returns how long `steps` steps take: the first (its trace), then the pace of the others."""
        if not steps or not self.ends:
            return None
        step = self.step_seconds()
        return self.ends[0] * steps if step is None else self.ends[0] + (steps - 1) * step
