"""Precision plans: the compute dtype of every layer, with the evidence behind it, as a JSON value."""

from .plan import METADATA_SLOTS, PlanDiff, PrecisionPlan
from .rules import PlanRule
from .serialize import FORMAT_VERSION

__all__ = ["FORMAT_VERSION", "METADATA_SLOTS", "PlanDiff", "PlanRule", "PrecisionPlan"]
