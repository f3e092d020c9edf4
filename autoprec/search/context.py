"""`SearchSettings` (the rarer knobs) and `SearchContext`: one call's arguments and what every stage reads."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import keras
import optuna

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16_TRIALS, FLOAT32, PLAN_DTYPES, widen
from .._core.models import ConfigValue, show_message
from ..cost import CostTable
from ..errors import AutoprecError
from ..hardware import HardwareProfile
from ..layers import LayerInfo
from ..plan import PrecisionPlan
from ..profiler import Profile
from ..runtime.kernels import checked_plan
from .budget import (
    FLOOR_RULE,
    SIXTEEN_BIT,
    Budget,
    OutputFloor,
    converged_outputs,
    measure_floor,
)
from .evaluator import Evaluator, FidelityCheck
from .result import TrialRecord
from .space import Group, PlanCosts, output_paths, plan_from_assignment

#: An Optuna callback: called with the study and each finished trial.
StudyCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]


@dataclasses.dataclass(frozen=True)
class SearchSettings(ConfigValue):
    """The rarely changed settings of `autoprec.search`, kept apart from its main arguments.

    Build one, print it, reuse it (`dataclasses.replace(settings, steps_per_trial=40)` derives a
    variant); `get_config()` / `from_config()` round-trip it. docs/api.md tells each field.

    Args:
        batch_size: batch size for array data (datasets keep their own batches).
        steps_per_trial: training steps of every trial, on the same first batches.
        max_steps_per_trial: the longest a trial may be lengthened to; default 8 x the above.
        validation_steps: validation batches evaluated (default all).
        seed: seeds the sampler and every evaluation.
        dtypes: dtypes the search may use; default float32 and those fast on `hardware`.
        keep_float32: globs on layer paths or class names kept in float32.
        group_by: `"layer"`, `"block"`, `"auto"` or an int (most groups).
        profile: an `autoprec.Profile` to reuse; default profiled here when needed.
        profile_steps: batches the profiler sees when it runs here.
        costs: an `autoprec.CostTable` to reuse instead of measuring or predicting.
        cost_batch_size: batch size the step time is costed for; default `batch_size`.
        proxy_batches: calibration batches of the numerical proxy.
        proxy_tolerance: the proxy's relative loss error above which a plan is pruned.
        reference_repeats: extra float32 runs to report the reference's spread.
        baseline: the untrained score: `"auto"`, a number, or `None` to skip the check.
        confirm_steps: training steps of the confirmation; default 4 x the search's, 0 never.
        measure_speedup: time the final plan here (default: when `hardware="local"`).
        float16_trials: `"native"`, `"emulated"` or `"auto"` (emulated where float16 is slow).
        plan_path: where the best plan so far is written after every improving trial.
        callbacks: extra Optuna callbacks `(study, frozen_trial)`.
        catch: exceptions that fail a trial instead of stopping the search.

    Example:

    ```python
    settings = autoprec.SearchSettings(batch_size=64, steps_per_trial=40, plan_path="plan.json")
    result = autoprec.search(model, (x, y), (x_val, y_val),
                             budget=autoprec.Budget("val_accuracy", max_drop=0.01),
                             settings=settings)
    ```
    """

    batch_size: int = 32
    steps_per_trial: int = 20
    max_steps_per_trial: int | None = None
    validation_steps: int | None = None
    seed: int | None = 0
    dtypes: tuple[str, ...] | None = None
    keep_float32: tuple[str, ...] = ()
    group_by: str | int = "auto"
    profile: Profile | None = None
    profile_steps: int = 4
    costs: CostTable | None = None
    cost_batch_size: int | None = None
    proxy_batches: int = 2
    proxy_tolerance: float = 0.5
    reference_repeats: int = 0
    baseline: float | str | None = "auto"
    confirm_steps: int | None = None
    measure_speedup: bool | None = None
    float16_trials: str = "auto"
    plan_path: str | os.PathLike | None = None
    callbacks: tuple[StudyCallback, ...] = ()
    catch: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        for name in ("dtypes", "keep_float32", "callbacks", "catch"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))
        required = ("batch_size", "steps_per_trial", "profile_steps", "proxy_batches")
        optional = ("max_steps_per_trial", "validation_steps", "cost_batch_size")
        counts = ("reference_repeats", "confirm_steps")  # 0 allowed
        for name in (*required, *optional, *counts):
            value, least = getattr(self, name), 0 if name in counts else 1
            if (value is not None or name in required) and (
                isinstance(value, bool) or not isinstance(value, int) or value < least
            ):
                kind = "a positive integer" if least else "an integer >= 0"
                raise AutoprecError(f"SearchSettings.{name} must be {kind}, got {value!r}.")
        if self.dtypes is not None:
            unknown = [dtype for dtype in self.dtypes if dtype not in PLAN_DTYPES]
            if unknown or not self.dtypes:
                raise AutoprecError(
                    f"SearchSettings.dtypes={list(self.dtypes)!r}: each must be one of "
                    f"{', '.join(PLAN_DTYPES)}, and at least one is needed."
                )
        choices = {  # name: (the strings it takes, how to say what it takes)
            "group_by": (("layer", "block", "auto"), "'layer', 'block', 'auto' or an integer"),
            "baseline": (("auto",), "'auto', a number, or None to skip the check"),
            "float16_trials": (FLOAT16_TRIALS, ", ".join(map(repr, FLOAT16_TRIALS))),
        }
        for name, (strings, said) in choices.items():
            value = getattr(self, name)
            if value not in strings and (isinstance(value, str) or name == "float16_trials"):
                raise AutoprecError(f"SearchSettings.{name}={value!r}: use {said}.")
        loaders = {"profile": "autoprec.Profile.load(path)", "costs": "CostTable.load(path)"}
        for name, kind in (("profile", Profile), ("costs", CostTable)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise AutoprecError(
                    f"SearchSettings.{name} must be an autoprec.{kind.__name__} ({loaders[name]} "
                    f"reads one), got {type(value).__name__}."
                )

    @property
    def longest_steps_per_trial(self) -> int:
        """The most training steps a trial may be lengthened to."""
        return self.max_steps_per_trial or 8 * self.steps_per_trial


@dataclasses.dataclass
class StageClock:
    """Seconds spent in each stage of one search, added up as the search goes."""

    seconds: dict[str, float] = dataclasses.field(default_factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Adds the seconds spent inside the block to `seconds[name]`."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started


logger = logging.getLogger("autoprec")


@dataclasses.dataclass
class SearchContext:
    """One `search()` call: its resolved arguments, what `prepare` builds once, the study filled."""

    model: keras.Model
    evaluator: Evaluator
    budget: Budget
    hardware: HardwareProfile | str
    n_trials: int | None
    timeout: float | None
    storage: str | os.PathLike | optuna.storages.BaseStorage | None
    study_name: str | None
    study: optuna.Study | None  # the study given, then the one the trials run in
    sampler: optuna.samplers.BaseSampler | None
    pruner: optuna.pruners.BasePruner | None
    settings: SearchSettings
    verbose: int
    started: float
    train_data: Any
    clock: StageClock = dataclasses.field(default_factory=StageClock)
    infos: Mapping[str, LayerInfo] = dataclasses.field(init=False)
    compute: list[str] = dataclasses.field(init=False)
    groups: list[Group] = dataclasses.field(init=False)
    allowed: dict[str, tuple[str, ...]] = dataclasses.field(init=False)
    costs: PlanCosts = dataclasses.field(init=False)
    reference: float = dataclasses.field(init=False)
    float32_seconds: float = dataclasses.field(init=False)
    risk: dict[str, float] = dataclasses.field(default_factory=dict)
    # {assignment key: what a trial reusing its training records: metrics, proxy, reused_from}
    cache: dict[str, TrialRecord] = dataclasses.field(default_factory=dict)
    floors: dict[tuple[tuple[str, str], ...], OutputFloor | None] = dataclasses.field(
        default_factory=dict
    )
    logged_fallbacks: set[tuple[str, ...]] = dataclasses.field(default_factory=set)
    hardware_profile: HardwareProfile | None = None
    table: CostTable | None = None
    dtypes: tuple[str, ...] = ()
    float16_trials: str | None = None
    profile: Profile | None = None
    unsafe: Mapping[str, str] = dataclasses.field(default_factory=dict)
    removed: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    outputs: set[str] = dataclasses.field(default_factory=set)
    fidelity: FidelityCheck | None = None
    spread: float | None = None
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    finalists: dict[str, Any] | None = None  # set by add_finalists: their trials, what was skipped
    ranked: list[optuna.trial.FrozenTrial] = dataclasses.field(default_factory=list)
    measured: Any = None  # set by rank_trials: the `MeasuredRanking` where steps were timed
    measure: bool = False  # whether the chosen plan's step is timed here

    @property
    def train_steps(self) -> int:
        """The search's fidelity: training steps of every trial."""
        return len(self.evaluator.train_batches)

    def assignment(self, params: Mapping[str, str]) -> dict[str, str]:
        """Returns `{compute path: dtype}` of group parameters, widened to what each layer allows."""
        return {
            path: widen(params.get(group.name, group.choices[0]), self.allowed[path])
            for group in self.groups
            for path in group.paths
        }

    def normalise(self, assignment: Mapping[str, str]) -> dict[str, str]:
        """Returns `{compute path: dtype}`: float32 where missing, widened to what each allows."""
        return {
            path: widen(assignment.get(path, FLOAT32), self.allowed[path]) for path in self.compute
        }

    def params_for(self, assignment: Mapping[str, str]) -> dict[str, str]:
        """Returns the group parameters closest to a per-layer assignment (each group's majority)."""
        params = {}
        for group in self.groups:
            if len(group.choices) > 1:
                chosen = [assignment.get(path, FLOAT32) for path in group.paths]
                params[group.name] = max(
                    group.choices, key=lambda dtype: (chosen.count(dtype), dtype == FLOAT32)
                )
        return params

    def uniform_assignment(self, dtype: str) -> dict[str, str]:
        """Returns `dtype` on every compute layer, widened to what each allows."""
        return {path: widen(dtype, self.allowed[path]) for path in self.compute}

    def float32_plan(self) -> PrecisionPlan:
        """Returns the float32 plan of the model."""
        return self.plan_for(self.uniform_assignment(FLOAT32))

    def plan_for(self, assignment: Mapping[str, str], **kwargs: object) -> PrecisionPlan:
        """Returns the plan of a per-layer assignment, as the model can run it."""
        plan = plan_from_assignment(self.model, self.infos, self.normalise(assignment), **kwargs)
        return checked_plan(self.model, plan, logged=self.logged_fallbacks)

    def trial_assignment(self, trial: optuna.trial.FrozenTrial | optuna.Trial) -> dict[str, str]:
        """Returns the per-layer assignment a trial evaluates (its record's, else its params)."""
        stored = TrialRecord.from_trial(trial).assignment
        return self.normalise(stored) if stored else self.assignment(trial.params)

    def trial_plan(self, trial: optuna.trial.FrozenTrial, **kwargs: object) -> PrecisionPlan:
        """Returns the plan a trial evaluated."""
        return self.plan_for(self.trial_assignment(trial), **kwargs)

    def is_float32(self, trial: optuna.trial.FrozenTrial) -> bool:
        """Whether a trial evaluated the float32 plan."""
        return all(dtype == FLOAT32 for dtype in self.trial_assignment(trial).values())

    @functools.cached_property
    def output_paths(self) -> tuple[str, ...]:
        """The compute layer producing each of the model's outputs (`keras.tree.flatten` order)."""
        return output_paths(self.model, self.infos)

    def output_floor(self, assignment: Mapping[str, str]) -> OutputFloor | None:
        """Returns the rounding floor a plan's 16-bit outputs put on the budget metric."""
        # A float8 output layer returns its outputs in its source dtype, bfloat16.
        normalised = self.normalise(assignment)
        dtypes = {
            path: BFLOAT16 if normalised[path] == FLOAT8 else normalised[path]
            for path in dict.fromkeys(self.output_paths)
            if normalised.get(path, FLOAT32) in (*SIXTEEN_BIT, FLOAT8)
        }
        if not dtypes:
            return None
        key = tuple(sorted(dtypes.items()))
        if key not in self.floors:
            floor = self._measured_floor(dtypes)
            self.floors[key] = floor
            if floor is not None and floor.refused:
                say(self.verbose, f"{floor.reason}: plans with them are refused.")
        return self.floors[key]

    def _measured_floor(self, dtypes: Mapping[str, str]) -> OutputFloor | None:
        """Measures and judges the floor of the given 16-bit outputs; `None` when it cannot."""
        try:
            outputs, sources, metric_of = self._floor_inputs
            paths = self.output_paths  # the last compute layer's for all, if they do not pair
            paths = paths if len(paths) == len(outputs) else paths[-1:] * len(outputs)
            rounded = {  # {output path: {index of the output: dtype}}
                path: {index: dtype for index, other in enumerate(paths) if other == path}
                for path, dtype in dtypes.items()
            }
            floors = {
                path: measure_floor(metric_of, outputs, indices, self.budget)
                for path, indices in rounded.items()
            }
            everything = {index: dtype for one in rounded.values() for index, dtype in one.items()}
            together = (
                next(iter(floors.values()))
                if len(dtypes) == 1
                else measure_floor(metric_of, outputs, everything, self.budget)
            )
        except Exception as error:  # noqa: BLE001 - a floor that cannot be measured refuses nothing
            logger.warning(
                "autoprec.search: the output rounding floor of %s on %s could not be measured "
                "(%s: %s); plans with 16-bit outputs are judged by their trials alone.",
                ", ".join(f"{dtype} {path!r}" for path, dtype in dtypes.items()),
                self.budget.metric,
                type(error).__name__,
                error,
            )
            return None
        where = {path: sources[min(indices)] for path, indices in rounded.items() if indices}
        return OutputFloor(self.budget, self.reference, dtypes, floors, where, together)

    @functools.cached_property
    def _floor_inputs(self) -> tuple[list, tuple[str, ...], Any]:
        """`(converged outputs, their sources, metric_of)` on the validation data."""
        evaluator = self.evaluator
        symbolic = keras.tree.flatten(getattr(evaluator.model, "outputs", None) or [])
        if symbolic:
            shapes = [tuple(tensor.shape[1:]) for tensor in symbolic]
        else:
            shapes = [None] * len(keras.tree.flatten(evaluator.float32_outputs()))
        outputs, sources = converged_outputs(evaluator.val_y, shapes, evaluator.float32_outputs)
        targets = evaluator.val_y
        structure = (
            targets
            if len(keras.tree.flatten(targets)) == len(outputs)
            else evaluator.float32_outputs()
        )

        def metric_of(arrays: list) -> dict[str, float]:
            return evaluator.validation_metrics(keras.tree.pack_sequence_as(structure, arrays))

        return outputs, sources, metric_of

    def floor_evidence(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Returns `{output path: {16-bit dtype: floor record}}` for each dtype an output may take."""
        evidence: dict[str, dict[str, dict[str, Any]]] = {}
        for path in dict.fromkeys(self.output_paths):
            for dtype in (d for d in self.allowed.get(path, ()) if d in SIXTEEN_BIT):
                floor = self.output_floor({path: dtype})
                if floor is not None:
                    evidence.setdefault(path, {})[dtype] = floor.to_dict()
        return evidence

    def floor_metadata(self) -> dict[str, Any]:
        """Returns the search's floor record: the rule, each output's floors, the trials refused."""
        refused = {}
        for trial in self.study.get_trials(deepcopy=False) if self.study is not None else ():
            record = trial.user_attrs.get("output_floor")
            if isinstance(record, Mapping) and record.get("refused"):
                refused[str(trial.number)] = record.get("reason")
        return {
            "rule": dict(FLOOR_RULE),
            "outputs": self.floor_evidence(),
            "refused_trials": refused,
        }


def say(verbose: int, text: str) -> None:
    """Shows one progress line of the search when `verbose` asks for it."""
    if verbose:
        show_message(f"autoprec.search: {text}")
