"""Tests for `autoprec.search.explore`: neighbours of the best plan, enqueued after the warm starts."""

from __future__ import annotations

import keras
from search.search_models import far_regression, far_targets

from autoprec.search import Budget, SearchSettings, TrialRecord, search


def test_after_the_warm_starts_a_neighbour_repairs_a_faster_plan_that_missed_the_budget():
    keras.utils.set_random_seed(0)
    train, val = far_targets()
    result = search(
        far_regression(),
        train,
        val,
        budget=Budget("val_mae", max_relative_drop=0.1),
        hardware="rtx4090",
        n_trials=4,
        verbose=0,
        settings=SearchSettings(
            dtypes=["float32", "bfloat16"],
            steps_per_trial=2,
            cost_batch_size=4096,
            proxy_batches=1,
            confirm_steps=0,
        ),
    )
    records = [TrialRecord.from_trial(t) for t in result.study.trials]
    warm = [r for r in records if r.warm_start]
    uniform = {r.warm_start: r for r in warm}["uniform bfloat16"]
    assert uniform.budget_violation > 0  # the bfloat16 head misses the budget
    neighbour = records[len(warm)]
    assert neighbour.neighbour.endswith("-> float32")
    before, after = uniform.assignment, neighbour.assignment
    changed = [path for path in before if before[path] != after[path]]
    assert len(changed) == 1 and after[changed[0]] == "float32"
    assert neighbour.predicted_seconds < result.float32_predicted_seconds
    assert result.plan.layers["head"] == "float32"
