"""`SearchContext`: one `search()` call's model, data, space, costs, reference and study."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping
from typing import Any

import keras
import optuna

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT32, widen
from .._core.models import show_message
from ..cost import CostTable
from ..hardware import HardwareProfile
from ..layers import LayerInfo
from ..plan import PrecisionPlan
from ..profiler import Profile
from ..runtime.kernels import checked_plan
from .budget import Budget
from .evaluator import Evaluator, FidelityCheck
from .floor import (
    OUTPUT_FLOOR_ATTR,
    SIXTEEN_BIT,
    FloorRule,
    OutputFloor,
    converged_outputs,
    judge_floor,
    measure_floor,
    output_paths,
)
from .record import TrainedOutcome, TrialRecord
from .settings import SearchRequest
from .space import Group, PlanCosts, plan_from_assignment

logger = logging.getLogger("autoprec")


@dataclasses.dataclass
class SearchContext:
    """One `search()` call: what every stage reads, built once, and the study its trials fill."""

    model: keras.Model
    infos: Mapping[str, LayerInfo]
    compute: list[str]
    groups: list[Group]
    allowed: dict[str, tuple[str, ...]]
    evaluator: Evaluator
    costs: PlanCosts
    budget: Budget
    reference: float
    float32_seconds: float
    verbose: int
    risk: dict[str, float] = dataclasses.field(default_factory=dict)
    cache: dict[str, TrainedOutcome] = dataclasses.field(default_factory=dict)
    floor_rule: FloorRule = dataclasses.field(default_factory=FloorRule)
    floors: dict[tuple[tuple[str, str], ...], OutputFloor | None] = dataclasses.field(
        default_factory=dict
    )
    logged_fallbacks: set[tuple[str, ...]] = dataclasses.field(default_factory=set)
    request: SearchRequest | None = None
    hardware_profile: HardwareProfile | None = None
    table: CostTable | None = None
    dtypes: tuple[str, ...] = ()
    float16_trials: str | None = None
    profile: Profile | None = None
    unsafe: Mapping[str, str] = dataclasses.field(default_factory=dict)
    removed: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    outputs: set[str] = dataclasses.field(default_factory=set)
    reference_metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    fidelity: FidelityCheck | None = None
    spread: float | None = None
    study: optuna.Study | None = None
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def train_steps(self) -> int:
        """The search's fidelity: training steps of every trial."""
        return len(self.evaluator.train_batches)

    def assignment(self, params: Mapping[str, str]) -> dict[str, str]:
        """Returns `{compute path: dtype}` of group parameters, widened to what each layer allows."""
        dtypes = {}
        for group in self.groups:
            choice = params.get(group.name, group.choices[0])
            for path in group.paths:
                dtypes[path] = widen(choice, self.allowed[path])
        return dtypes

    def normalise(self, assignment: Mapping[str, str]) -> dict[str, str]:
        """Returns `{compute path: dtype}`: float32 where missing, widened to what each layer
        allows."""
        return {
            path: widen(assignment.get(path, FLOAT32), self.allowed[path]) for path in self.compute
        }

    def params_for(self, assignment: Mapping[str, str]) -> dict[str, str]:
        """Returns the group parameters closest to a per-layer assignment (each group's majority)."""
        params = {}
        for group in self.groups:
            if len(group.choices) <= 1:
                continue
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

    def trial_assignment(self, trial: optuna.trial.FrozenTrial) -> dict[str, str]:
        """Returns the per-layer assignment a trial evaluated (its record's, else its params)."""
        stored = TrialRecord.from_trial(trial).assignment
        if stored:
            return self.normalise(stored)
        return self.assignment(trial.params)

    def trial_plan(self, trial: optuna.trial.FrozenTrial, **kwargs: object) -> PrecisionPlan:
        """Returns the plan a trial evaluated."""
        return self.plan_for(self.trial_assignment(trial), **kwargs)

    def is_float32(self, trial: optuna.trial.FrozenTrial) -> bool:
        """Whether a trial evaluated the float32 plan."""
        return all(dtype == FLOAT32 for dtype in self.trial_assignment(trial).values())

    # ------------------------------------------------------------------ output rounding floor

    @functools.cached_property
    def output_paths(self) -> tuple[str, ...]:
        """The compute layer producing each of the model's outputs (`keras.tree.flatten` order)."""
        return output_paths(self.model, self.infos)

    def output_floor(self, assignment: Mapping[str, str]) -> OutputFloor | None:
        """Returns the rounding floor a plan's 16-bit outputs put on the budget metric."""
        # A float8 output layer returns its outputs in its source dtype, bfloat16.
        normalised = {
            path: BFLOAT16 if dtype == FLOAT8 else dtype
            for path, dtype in self.normalise(assignment).items()
        }
        dtypes = {
            path: normalised[path]
            for path in dict.fromkeys(self.output_paths)
            if normalised.get(path, FLOAT32) in SIXTEEN_BIT
        }
        if not dtypes:
            return None
        key = tuple(sorted(dtypes.items()))
        if key not in self.floors:
            floor = self._measured_floor(dtypes)
            self.floors[key] = floor
            if floor is not None and floor.refused and self.verbose:
                show_message(f"autoprec.search: {floor.reason}: plans with them are refused.")
        return self.floors[key]

    def _measured_floor(self, dtypes: Mapping[str, str]) -> OutputFloor | None:
        """Measures and judges the floor of the given 16-bit outputs; `None` when it cannot."""
        try:
            outputs, sources, metric_of = self._floor_inputs
            indices = {
                path: [i for i, p in enumerate(self._paths_per_output) if p == path]
                for path in dtypes
            }
            floors = {
                path: measure_floor(
                    metric_of, outputs, {i: dtypes[path] for i in indices[path]}, self.budget
                )
                for path in dtypes
            }
            rounded = {i: dtypes[path] for path in dtypes for i in indices[path]}
            together = (
                next(iter(floors.values()))
                if len(dtypes) == 1
                else measure_floor(metric_of, outputs, rounded, self.budget)
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
        where = {path: sources[indices[path][0]] for path in dtypes if indices[path]}
        return judge_floor(
            self.budget, self.reference, dtypes, floors, where, together, self.floor_rule
        )

    @functools.cached_property
    def _paths_per_output(self) -> tuple[str, ...]:
        """The output layer of each converged output (the last compute layer for all, if unknown)."""
        paths = self.output_paths
        count = len(self._floor_inputs[0])
        return paths if len(paths) == count else tuple(paths[-1:] * count)

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
            for dtype in self.allowed.get(path, ()):
                if dtype not in SIXTEEN_BIT:
                    continue
                floor = self.output_floor({path: dtype})
                if floor is not None:
                    evidence.setdefault(path, {})[dtype] = floor.to_dict()
        return evidence

    def floor_metadata(self, study: optuna.Study | None = None) -> dict[str, Any]:
        """Returns the search's floor record: the rule, each output's floors, the trials refused."""
        refused = {}
        for trial in study.get_trials(deepcopy=False) if study is not None else ():
            record = trial.user_attrs.get(OUTPUT_FLOOR_ATTR)
            if isinstance(record, Mapping) and record.get("refused"):
                refused[str(trial.number)] = record.get("reason")
        return {
            "rule": self.floor_rule.to_dict(),
            "outputs": self.floor_evidence(),
            "refused_trials": refused,
        }
