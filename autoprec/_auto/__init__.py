"""The decision behind `AutoPrecision()` with no plan: profile + local costs -> heuristic plan.

Modules, each importable by `autoprec.callback` and re-exported here:

- `auto_plan`: `AutoPlan`, the settings of that automatic mode (profiling, batch size,
  the optional search).
- `first_batch`: `FirstBatchSize`, which reads the batch size `fit` trains with from
  inside the train step.
- `decide`: `decide_plan`, the heuristic plan from the profile and the costs at that
  batch size; `search_plan`, the short Optuna search run instead of the heuristic
  when a budget is given.
- `plan_report`: `report_lines`, the report printed when the automatic plan is applied.
- `race`: `race_candidates` / `race_traces` / `race_lines` / `race_winner_plan`, the
  plans whose whole train step is timed inside `fit` before one is kept, the traces
  that costs, the report of that timing and the plan it keeps.
"""

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
    race_candidates,
    race_lines,
    race_traces,
    race_winner_plan,
)
from .step_clock import UNPROFILED_STEPS, StepClock

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
