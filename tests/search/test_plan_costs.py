"""Tests for autoprec.search.plan_costs: predicted steps of assignments and of Keras' policies."""

from __future__ import annotations

import keras

from autoprec import PrecisionPlan, cost
from autoprec.layers import describe_model
from autoprec.search import compute_layers
from autoprec.search.space import PlanCosts


def _model() -> keras.Model:
    inputs = keras.Input((1024,))
    hidden = keras.layers.Dense(4096, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(10)(hidden))


def test_steps_agree_with_estimate_and_are_cached():
    model = _model()
    table = cost.predict_costs(model, "rtx4090", batch_size=4096)
    costs = PlanCosts(model, table, 4096)
    compute = compute_layers(describe_model(model))
    assignment = dict.fromkeys(compute, "bfloat16")
    seconds, activation_bytes = costs.step(assignment)
    assert seconds > 0 and activation_bytes > 0
    assert costs.step(assignment) == (seconds, activation_bytes)
    keras_policy = cost.estimate(
        model, PrecisionPlan.uniform(model, "bfloat16"), costs=table, batch_size=4096
    )
    assert costs.uniform_seconds("bfloat16") == keras_policy.step_seconds
    assert costs.step(dict.fromkeys(compute, "float32"))[0] > seconds
    assert costs.layer_seconds(compute[0], "float32") == table.seconds(compute[0], "float32", 4096)
    assert costs.layer_seconds("no/such/layer", "float32") is None
    assert costs.relative_error == table.relative_error


def test_without_a_table_parameters_rank_the_plans():
    model = _model()
    costs = PlanCosts(model, None, 32)
    compute = compute_layers(describe_model(model))
    assert not costs.available and costs.relative_error is None
    assert (
        costs.step(dict.fromkeys(compute, "bfloat16"))[0]
        < costs.step(dict.fromkeys(compute, "float32"))[0]
    )
