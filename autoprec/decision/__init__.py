"""The decision behind `AutoPrecision()` with no plan: profile + local costs -> heuristic plan."""

from .auto_plan import (
    DECISION_CAP_SECONDS,
    DECISION_SHARE,
    FIRST_EPOCH_SHARE,
    AutoPlan,
    decision_budget,
)
from .decide import (
    FALLBACK_BATCH_SIZE,
    MIN_CALIBRATION_SECONDS,
    decide_plan,
    measure_costs,
    search_plan,
)
from .first_batch import RECORDED_DIMENSIONS, FirstBatchSize
from .plan_report import report_lines
from .race import (
    PER_LAYER,
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
    "MIN_CALIBRATION_SECONDS",
    "PER_LAYER",
    "RECORDED_DIMENSIONS",
    "UNPROFILED_STEPS",
    "AutoPlan",
    "FirstBatchSize",
    "StepClock",
    "decide_plan",
    "decision_budget",
    "measure_costs",
    "race_candidates",
    "race_lines",
    "race_traces",
    "race_winner_plan",
    "report_lines",
    "search_plan",
]
