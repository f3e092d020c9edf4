"""`SearchContext`: everything a trial needs, built once per `search()` call."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import keras
import optuna

from .._core.dtypes import FLOAT32, widen
from ..layers import LayerInfo
from ..plan import PrecisionPlan
from .budget import Budget
from .evaluator import Evaluator
from .heuristic import PlanCosts
from .record import TrainedOutcome, TrialRecord
from .space import Group, plan_from_assignment


@dataclasses.dataclass
class SearchContext:
    """Everything a trial needs, built once per `search()` call.

    Attributes:
        model: the user's model (plans are built for it).
        infos: `{path: LayerInfo}` of every layer.
        compute: the compute layers' paths.
        groups: the search space's groups.
        allowed: `{compute path: dtypes it may take}`.
        evaluator: the trials' `Evaluator`.
        costs: the plans' predicted (or measured) step costs.
        budget: the `Budget`.
        reference: the float32 reference's budget metric.
        float32_seconds: the float32 plan's step seconds.
        verbose: the search's verbosity.
        risk: `{compute path: risk of 16-bit}`, for the neighbour moves.
        cache: `{assignment key: TrainedOutcome}` trained by this process.
    """

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
        """Returns `{compute path: dtype}`: float32 where missing, widened to what each layer allows."""
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
        """Returns the plan of a per-layer assignment (`kwargs` go to `plan_from_assignment`)."""
        return plan_from_assignment(self.model, self.infos, self.normalise(assignment), **kwargs)

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
