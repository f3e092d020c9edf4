"""What a model runs after a callback applied a plan (autoprec/runtime/apply.py)."""

from __future__ import annotations

from autoprec import Guard, PrecisionPlan
from autoprec.runtime import PlanCallback
from autoprec.runtime.apply import APPLIED_ATTRIBUTE, applied_state, keep_applied_state


def test_the_state_says_whether_the_model_still_runs_a_plan(mlp, classification):
    x, y = classification
    mlp.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    assert applied_state(mlp) is None
    plan = PrecisionPlan.uniform(mlp, "float16").with_dtype("dense_2", "float32")
    callback = PlanCallback(plan, verbose=0)
    mlp.fit(x, y, epochs=1, verbose=0, callbacks=[callback])
    state = applied_state(mlp)
    assert state.requested is plan and state.handle.plan == callback.plan
    assert state.handle.dtypes == callback.handle.dtypes and state.telemetry.installed
    assert state.optimizer is mlp.optimizer and state.unwrapped_optimizer is not mlp.optimizer
    assert state.runs(mlp, plan, callback.guard)
    assert state.runs(mlp, PrecisionPlan.from_json(plan.to_json()), Guard())  # equal values
    assert not state.runs(mlp, plan, None)  # another guard
    assert not state.runs(mlp, plan.with_dtype("dense", "bfloat16"), callback.guard)
    mlp.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    assert not state.runs(mlp, plan, callback.guard)  # recompiled: new functions, new optimizer
    keep_applied_state(mlp, None)
    assert applied_state(mlp) is None and not hasattr(mlp, APPLIED_ATTRIBUTE)
    keep_applied_state(mlp, None)  # removing twice is harmless
    keep_applied_state(mlp, state)
    assert applied_state(mlp) is state
