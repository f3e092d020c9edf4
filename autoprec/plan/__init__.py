"""Precision plans: the compute dtype of every layer, with the evidence behind it, as a JSON value.

A `PrecisionPlan` is an immutable value: `with_dtype`, `with_rule`, `with_metadata`
and `with_event` return new plans. It saves to and loads from versioned JSON,
turns into a Keras `DTypePolicyMap`, and `diff` says what two plans assign differently.
"""

from .diff import PlanDiff
from .plan import METADATA_SLOTS, PrecisionPlan
from .rules import PlanRule
from .serialize import FORMAT_VERSION

__all__ = ["FORMAT_VERSION", "METADATA_SLOTS", "PlanDiff", "PlanRule", "PrecisionPlan"]
