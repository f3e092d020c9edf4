"""The decision behind `AutoPrecision()` with no plan: profile + local costs -> heuristic plan."""

from .decide import (
    DECISION_CAP_SECONDS,
    DECISION_SHARE,
    FALLBACK_BATCH_SIZE,
    PAYBACK_SHARE,
    AutoPlan,
    FirstBatchSize,
    best_predicted_speedup,
    decide_plan,
    decision_budget,
    race_budget,
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
    "PAYBACK_SHARE",
    "FALLBACK_BATCH_SIZE",
    "UNPROFILED_STEPS",
    "AutoPlan",
    "FirstBatchSize",
    "StepClock",
    "decide_plan",
    "best_predicted_speedup",
    "decision_budget",
    "race_budget",
    "race_candidates",
    "race_lines",
    "race_traces",
    "race_winner_plan",
    "report_lines",
]
