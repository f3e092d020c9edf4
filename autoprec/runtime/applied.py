"""`AppliedState`: what a model runs after a callback applied a plan, kept on the model itself."""

from __future__ import annotations

import dataclasses

import keras

from ..plan import PrecisionPlan
from .apply import PlanHandle
from .guard import Guard
from .telemetry import GuardTelemetry

#: The model attribute that holds its `AppliedState`.
APPLIED_ATTRIBUTE = "_autoprec_applied_plan"

#: The compiled functions Keras traces for a model, rebuilt when the policies change.
COMPILED_FUNCTIONS = ("train_function", "test_function", "predict_function")


@dataclasses.dataclass
class AppliedState:
    """What a model runs: the plan asked for and as applied, and what it was set up with."""

    requested: PrecisionPlan
    handle: PlanHandle
    guard: Guard | None
    optimizer: object
    unwrapped_optimizer: object
    telemetry: GuardTelemetry | None
    train_function: object

    @property
    def plan(self) -> PrecisionPlan:
        """The plan as applied."""
        return self.handle.plan

    @property
    def dtypes(self) -> dict[str, str]:
        """`{path: dtype}` the layers compute in."""
        return self.handle.dtypes

    def runs(self, model: keras.Model, plan: PrecisionPlan, guard: Guard | None) -> bool:
        """Whether `model` still runs `plan` as applied here, with nothing reset since."""
        return (
            model.train_function is not None
            and model.train_function is self.train_function
            and model.optimizer is self.optimizer
            and guard == self.guard
            and (self.telemetry is None or self.telemetry.installed)
            and (plan is self.requested or plan is self.plan or plan == self.requested)
        )


def applied_state(model: keras.Model) -> AppliedState | None:
    """Returns the `AppliedState` kept on `model`, or `None` when no plan was applied by a callback."""
    return getattr(model, APPLIED_ATTRIBUTE, None)


def keep_applied_state(model: keras.Model, state: AppliedState | None) -> None:
    """Keeps `state` on `model` (bypassing Keras' attribute tracking); `None` removes it."""
    if state is not None:
        object.__setattr__(model, APPLIED_ATTRIBUTE, state)
    elif applied_state(model) is not None:
        object.__delattr__(model, APPLIED_ATTRIBUTE)
