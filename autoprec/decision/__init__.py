"""The decision behind `AutoPrecision()` with no plan: profile + local costs -> heuristic plan."""

from .decide import (
    DECISION_CAP_SECONDS,
    DECISION_SHARE,
    FALLBACK_BATCH_SIZE,
    FIRST_EPOCH_SHARE,
    AutoPlan,
    FirstBatchSize,
    decide_plan,
    decision_budget,
    report_lines,
)
from .race import (
    UNPROFILED_STEPS,
    StepClock,
    race_candidates,
    race_lines,
    race_traces,
    race_winner_plan,
)

__all__ = [
    "DECISION_CAP_SECONDS",
    "DECISION_SHARE",
    "FIRST_EPOCH_SHARE",
    "FALLBACK_BATCH_SIZE",
    "UNPROFILED_STEPS",
    "AutoPlan",
    "FirstBatchSize",
    "StepClock",
    "decide_plan",
    "decision_budget",
    "race_candidates",
    "race_lines",
    "race_traces",
    "race_winner_plan",
    "report_lines",
]
