"""`autoprec demo`: profile, search, train and time a built-in model on this device."""

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
