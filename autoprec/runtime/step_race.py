"""Candidate plans' whole train steps timed inside `fit`, interleaved, and the verdict on them.

Per-layer costs do not add up to the whole step (casts at dtype boundaries, lost
fusion, layout changes), so a plan decided from them is timed as `fit` runs it
before it is kept:

- `StepRace`: runs the next steps of `fit` under each candidate plan in turn
  (each traced once, then interleaved rounds whose order rotates) and times them;
  the steps train the model as usual, so only the slower candidates' extra time
  and their traces are added to the first epoch.
- `judge_rounds`: the pure verdict on the timed rounds; a difference inside the
  measured noise goes to the simpler plan.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras

from .._core.dtypes import POLICY_FOR_DTYPE
from ..layers import layer_paths
from ..plan import PrecisionPlan
from .apply import apply_plan

#: Smallest relative difference between two medians read as real, whatever the rounds' spread.
MIN_TOLERANCE = 0.03
#: Largest tolerance: a spread wider than this still lets a 2x faster plan win.
MAX_TOLERANCE = 0.25


@dataclasses.dataclass(frozen=True)
class StepVerdict:
    """What the timed rounds say: the plan to keep, and how sure that is.

    Attributes:
        winner: the name of the plan to keep.
        fastest: the name of the plan with the lowest median.
        medians: `{name: median seconds per step}`.
        minimums: `{name: fastest round's seconds per step}`.
        tolerance: the relative difference read as noise (from the rounds' spread).
        tie: whether a faster, less simple plan lost to `winner` only by noise.
        decided: whether more rounds could not change `winner` (every other plan
            is either clearly slower, or the winner is clearly not beaten).

    Example:

    ```python
    verdict = judge_rounds({"float32": [1.0, 1.02, 0.99], "per-layer": [0.8, 0.82, 0.79]},
                           ["float32", "per-layer"])
    verdict.winner  # "per-layer"
    ```
    """

    winner: str
    fastest: str
    medians: Mapping[str, float]
    minimums: Mapping[str, float]
    tolerance: float
    tie: bool
    decided: bool

    def speedup(self, name: str, over: str) -> float:
        """Returns `over`'s median step over `name`'s (above 1: `name` is faster)."""
        return self.medians[over] / self.medians[name]


def rounds_tolerance(rounds: Mapping[str, Sequence[float]]) -> float:
    """Returns the relative difference the rounds' own spread cannot tell from noise.

    The spread of one plan's rounds is its median's distance from its fastest round,
    relative to the median; the tolerance is the median spread over the plans, kept
    between `MIN_TOLERANCE` and `MAX_TOLERANCE`.

    Args:
        rounds: `{name: seconds per step of each round}`.

    Returns:
        The tolerance, a fraction of a median.

    Example:

    ```python
    rounds_tolerance({"a": [1.0, 1.1, 1.2], "b": [2.0, 2.0, 2.1]})  # 0.05
    ```
    """
    spreads = []
    for figures in rounds.values():
        if figures:
            median = statistics.median(figures)
            spreads.append((median - min(figures)) / median if median > 0 else 0.0)
    spread = statistics.median(spreads) if spreads else 0.0
    return min(max(spread, MIN_TOLERANCE), MAX_TOLERANCE)


def judge_rounds(
    rounds: Mapping[str, Sequence[float]], simplest_first: Sequence[str]
) -> StepVerdict:
    """Returns the verdict on timed rounds: the simplest plan that no plan beats beyond noise.

    A plan beats a simpler one when its median is lower by more than the
    tolerance (`rounds_tolerance`) and its fastest round is lower too. The winner
    is the simplest plan that no other beats, so a difference inside the noise,
    or a split between median and fastest round, goes to the simpler plan.

    Args:
        rounds: `{name: seconds per step of each round}`; plans without rounds are left out.
        simplest_first: the plans' names, simplest first (e.g. float32, a uniform
            policy, then the per-layer plan); names missing from it rank last.

    Returns:
        The `StepVerdict`.

    Raises:
        ValueError: when no plan has a timed round.

    Example:

    ```python
    judge_rounds({"float32": [1.0, 1.01], "per-layer": [0.99, 1.0]}, ["float32", "per-layer"])
    # StepVerdict(winner="float32", tie=True, ...): 1 % is noise
    ```
    """
    timed = {name: list(figures) for name, figures in rounds.items() if figures}
    if not timed:
        raise ValueError("judge_rounds: no plan has a timed round.")
    order = [name for name in simplest_first if name in timed]
    order += [name for name in timed if name not in order]
    medians = {name: float(statistics.median(timed[name])) for name in order}
    minimums = {name: float(min(timed[name])) for name in order}
    tolerance = rounds_tolerance(timed)

    def beats(first: str, second: str, margin: float) -> bool:
        return (
            medians[first] < medians[second] * (1.0 - margin) and minimums[first] < minimums[second]
        )

    def winner_at(margin: float) -> str:
        return next(
            name for name in order if not any(beats(other, name, margin) for other in order)
        )

    winner = winner_at(tolerance)
    fastest = min(order, key=lambda name: (medians[name], order.index(name)))
    # More rounds narrow the spread; the verdict holds if it is the same at half and
    # twice the tolerance.
    decided = winner_at(tolerance / 2) == winner == winner_at(min(2 * tolerance, 1.0))
    return StepVerdict(
        winner=winner,
        fastest=fastest,
        medians=medians,
        minimums=minimums,
        tolerance=tolerance,
        tie=fastest != winner,
        decided=decided,
    )


@dataclasses.dataclass(frozen=True)
class RaceResult:
    """What the timed steps inside `fit` measured, and the plan they chose.

    Attributes:
        verdict: the `StepVerdict` on the timed rounds, or `None` when training
            ended before every plan had a timed round.
        rounds: `{name: seconds per step of each timed round}`.
        steps: training steps run while timing (traces and warm-up included).
        rounds_run: interleaved rounds timed.
        seconds: wall time of those steps, switches between plans included.
        added_seconds: what timing added to the epoch: `seconds` minus the same
            number of steps at the winner's median step (and its own first step).
    """

    verdict: StepVerdict | None
    rounds: Mapping[str, tuple[float, ...]]
    steps: int
    rounds_run: int
    seconds: float
    added_seconds: float

    def to_dict(self) -> dict[str, Any]:
        """Returns the result as JSON-ready values (milliseconds), for `plan.metadata["measured"]`."""
        record: dict[str, Any] = {
            "what": "whole train step inside fit, candidate plans interleaved",
            "steps": self.steps,
            "rounds": self.rounds_run,
            "seconds": round(self.seconds, 4),
            "added_seconds": round(self.added_seconds, 4),
            "rounds_ms": {
                name: [round(1e3 * value, 4) for value in figures]
                for name, figures in self.rounds.items()
            },
        }
        if self.verdict is not None:
            record.update(
                winner=self.verdict.winner,
                fastest=self.verdict.fastest,
                tie=self.verdict.tie,
                decided=self.verdict.decided,
                tolerance=round(self.verdict.tolerance, 4),
                median_ms={k: round(1e3 * v, 4) for k, v in self.verdict.medians.items()},
                min_ms={k: round(1e3 * v, 4) for k, v in self.verdict.minimums.items()},
            )
        return record


@dataclasses.dataclass
class _Candidate:
    name: str
    plan: PrecisionPlan
    dtypes: dict[str, str] | None = None
    train_function: Callable[..., Any] | None = None
    first_step: float | None = None


class StepRace:
    """Times candidate plans' train steps inside `fit`: call `begin_step` and `end_step` around each step.

    The first use of a candidate applies its plan and rebuilds the train function
    (its trace is the candidate's first, untimed, step); `warmup_steps` more steps
    are run untimed. Then come interleaved rounds in rotating order, each running
    `steps_per_round` timed steps of every candidate (a round's figure is their
    mean). After `rounds` rounds, rounds are added while the verdict is not
    decided, up to `max_rounds`. Switching candidates sets the policies and puts
    back the candidate's traced train function: nothing is traced twice.
    `close()` puts back every layer's policy as it was before the race (the caller
    then applies the winner as it would any plan).

    Args:
        model: the model `fit` trains (built, compiled).
        candidates: `{name: plan}`, simplest first.
        rounds: interleaved rounds timed before the verdict is read.
        steps_per_round: timed steps of each candidate per round (also its warm-up steps).
        max_rounds: rounds at most, while the verdict is undecided.

    Example:

    ```python
    race = StepRace(model, {"float32": f32_plan, "per-layer": plan})
    # inside a callback: race.begin_step() in on_train_batch_begin,
    # finished = race.end_step() in on_train_batch_end
    result = race.result()
    race.close()
    ```
    """

    def __init__(
        self,
        model: keras.Model,
        candidates: Mapping[str, PrecisionPlan],
        rounds: int = 5,
        steps_per_round: int = 2,
        max_rounds: int = 9,
    ) -> None:
        if not candidates:
            raise ValueError("StepRace: no candidate plans to time.")
        self.model = model
        self.candidates = [_Candidate(name, plan) for name, plan in candidates.items()]
        self.rounds = rounds
        self.steps_per_round = steps_per_round
        self.max_rounds = max(max_rounds, rounds)
        self._paths = layer_paths(model)
        self._original = {path: layer.dtype_policy for path, layer in self._paths.items()}
        self._schedule: list[tuple[int, bool]] = []
        for index in range(len(self.candidates)):
            self._schedule += [(index, False)] * (1 + steps_per_round)
        for round_index in range(rounds):
            self._schedule += self._round(round_index)
        self._position = 0
        self._rounds_run = 0
        self._timed: list[list[float]] = [[] for _ in self.candidates]
        self._round_steps: list[list[float]] = [[] for _ in self.candidates]
        self._current: int | None = None
        self._started: float | None = None
        self._first_begin: float | None = None
        self._last_end: float | None = None
        self._steps = 0
        self._finished = False

    @property
    def finished(self) -> bool:
        """Whether every scheduled step ran and the verdict is read."""
        return self._finished

    def begin_step(self) -> None:
        """Switches to the next scheduled candidate and starts the step's clock."""
        if self._finished:
            return
        now = time.perf_counter()
        if self._first_begin is None:
            self._first_begin = now
        index, _ = self._schedule[self._position]
        if index != self._current:
            self._use(index)
            self._current = index
        self._started = time.perf_counter()

    def end_step(self) -> bool:
        """Stops the step's clock and records it; returns whether the race is over."""
        if self._finished or self._started is None:
            return self._finished
        now = time.perf_counter()
        seconds = now - self._started
        self._last_end = now
        self._started = None
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
            if verdict is not None and not verdict.decided and self._rounds_run < self.max_rounds:
                self._schedule += self._round(self._rounds_run)
            else:
                self._finished = True
        return self._finished

    def result(self) -> RaceResult:
        """Returns what was measured so far, with the verdict when every plan has a round."""
        verdict = self._verdict()
        seconds = 0.0
        if self._first_begin is not None and self._last_end is not None:
            seconds = self._last_end - self._first_begin
        added = 0.0
        if verdict is not None:
            winner = next(c for c in self.candidates if c.name == verdict.winner)
            own_first = winner.first_step or 0.0
            added = seconds - (self._steps - 1) * verdict.medians[verdict.winner] - own_first
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
        )

    def close(self) -> None:
        """Puts back the policies every layer had before the race; the train function is stale."""
        for path, policy in self._original.items():
            layer = self._paths.get(path)
            if layer is not None:
                layer.dtype_policy = policy
        self._finished = True

    # ------------------------------------------------------------------ internals

    def _round(self, round_index: int) -> list[tuple[int, bool]]:
        count = len(self.candidates)
        shift = round_index % count
        order = list(range(count))[shift:] + list(range(count))[:shift]
        return [(index, True) for index in order for _ in range(self.steps_per_round)]

    def _verdict(self) -> StepVerdict | None:
        if any(not figures for figures in self._timed):
            return None
        rounds = {c.name: figures for c, figures in zip(self.candidates, self._timed)}
        return judge_rounds(rounds, [candidate.name for candidate in self.candidates])

    def _use(self, index: int) -> None:
        """Runs the candidate's plan from the next step: its own traced train function."""
        candidate = self.candidates[index]
        if candidate.train_function is None:
            handle = apply_plan(self.model, candidate.plan, strict=True)
            candidate.dtypes = dict(handle.dtypes)
            self.model.make_train_function(force=True)
            candidate.train_function = self.model.train_function
            return
        for path, dtype in candidate.dtypes.items():
            layer = self._paths.get(path)
            if layer is not None:
                layer.dtype_policy = POLICY_FOR_DTYPE[dtype]
        self.model.train_function = candidate.train_function
