"""`autoprec demo`: profile, search, train and time a built-in model on this device.

Split by job:

- `autoprec.demo.model`: the demo model (`build_pressure_model`), the tutorial's
  classifier (`build_model`) and the data each is trained on, generated here (nothing
  is downloaded);
- `autoprec.demo.run`: `run_demo`, what `autoprec demo` runs: profile, search, train
  every policy from the same weights, time their train steps side by side;
- `autoprec.demo.report`: the verdicts, tables and host line printed from the run's
  figures (`verdicts`, `results_table`).

The verdicts `run_demo` prints come from the figures the same run measured
(`verdicts`): the train steps of every policy timed side by side in interleaved
rounds, their minimum and median, and the loss of each policy trained from the same
weights. Where the plan is not faster than the best uniform policy within budget by
more than the timing noise, it says so.
"""

from .model import build_model, build_pressure_model, make_data, make_pressure_data
from .report import (
    NOISE,
    POLICIES,
    SIGNIFICANCE,
    UNIFORM_POLICIES,
    Comparison,
    budget_status,
    compare,
    host_text,
    layer_table,
    paired_rounds,
    results_table,
    rounds_needed,
    speed_relation,
    verdicts,
)
from .run import BUDGET, CARD_BATCH, describe_host, keras_global_policy, run_demo

__all__ = [
    "BUDGET",
    "CARD_BATCH",
    "NOISE",
    "POLICIES",
    "SIGNIFICANCE",
    "UNIFORM_POLICIES",
    "Comparison",
    "budget_status",
    "build_model",
    "build_pressure_model",
    "compare",
    "describe_host",
    "host_text",
    "keras_global_policy",
    "layer_table",
    "make_data",
    "make_pressure_data",
    "paired_rounds",
    "results_table",
    "rounds_needed",
    "run_demo",
    "speed_relation",
    "verdicts",
]
