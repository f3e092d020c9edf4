"""Precision plans: the compute dtype of every layer, with the evidence behind it, as a JSON value."""

from .diff import PlanDiff
from .plan import METADATA_SLOTS, PrecisionPlan
from .rules import PlanRule
from .serialize import FORMAT_VERSION

__all__ = ["FORMAT_VERSION", "METADATA_SLOTS", "PlanDiff", "PlanRule", "PrecisionPlan"]
