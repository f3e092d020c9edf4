"""Tests for autoprec.decision.decide: the heuristic plan decided from costs timed at fit's batches."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
from conftest import local_with_fast_bfloat16
from decision.auto_models import padded_dataset, sequence_model, sequences

import autoprec
from autoprec import AutoPrecision, cost
from autoprec.callback import AutoPlan
from autoprec.decision import decide_plan


def test_decide_plan_times_costs_at_the_sample_given(caplog):
    model = sequence_model()
    with caplog.at_level(logging.WARNING, logger="autoprec"):
        _, without = decide_plan(model, None, hardware="rtx4090", batch_size=8)
    assert without is None and "pass a batch of inputs (`x=...`)" in caplog.text
    kept = {}
    for length in (6, 18):
        sample = sequences(8, length)
        plan, estimate = decide_plan(model, None, hardware="rtx4090", batch_size=8, sample=sample)
        assert estimate is not None and estimate.batch_size == 8
        direct = cost.estimate(model, plan, "rtx4090", batch_size=8, x=sample)
        assert estimate.activation_bytes_per_sample == direct.activation_bytes_per_sample
        kept[length] = estimate.activation_bytes_per_sample
    assert kept[18] > 2.5 * kept[6]  # the activations of three times the sequence


def test_automatic_mode_measures_costs_on_a_padded_dataset(caplog):
    model = sequence_model()
    callback = AutoPrecision(
        hardware=local_with_fast_bfloat16(), auto=AutoPlan(profile_steps=1), verbose=0
    )
    with caplog.at_level(logging.INFO, logger="autoprec"):
        model.fit(padded_dataset([7, 15, 9]), verbose=0, callbacks=[callback])
    assert "cost model unavailable" not in caplog.text
    assert callback.estimate is not None and callback.estimate.source == "measured"
    assert callback.estimate.batch_size == 8
    # The costs were timed at the first batch's shapes: the table timed there (the model back
    # in float32, as it was timed) gives the same estimate.
    autoprec.apply_plan(model, autoprec.PrecisionPlan.uniform(model, "float32"))
    hardware = local_with_fast_bfloat16()
    dtypes = ["float32", "bfloat16"]
    at = {
        length: cost.estimate(
            model,
            callback.plan,
            costs=cost.calibrate(model, sequences(8, length), dtypes=dtypes, hardware=hardware),
            batch_size=8,
        ).activation_bytes_per_sample
        for length in (7, 15)
    }
    assert callback.estimate.activation_bytes_per_sample == at[7] != at[15]


def test_automatic_mode_gets_costs_for_a_keras_hub_bert_fed_dicts(caplog):
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=512,
        num_layers=1,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=16,
    )
    model = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=4, preprocessor=None)
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    rng = np.random.default_rng(0)
    x = {
        "token_ids": rng.integers(0, 512, (16, 16)).astype("int32"),
        "segment_ids": rng.integers(0, 2, (16, 16)).astype("int32"),
        "padding_mask": np.ones((16, 16), "int32"),
    }
    y = rng.integers(0, 4, (16,))
    callback = AutoPrecision(hardware="rtx4090", auto=AutoPlan(profile_steps=1), verbose=0)
    with caplog.at_level(logging.WARNING, logger="autoprec"):
        history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    assert "cost model unavailable" not in caplog.text
    assert callback.estimate is not None and callback.estimate.batch_size == 8
    assert callback.estimate.layer_seconds["bert_backbone/token_embedding"] > 0
    assert np.isfinite(history.history["loss"]).all()


def test_the_one_liner_describes_and_traces_the_model_once():
    from autoprec.cost import TRACES
    from autoprec.layers import DESCRIPTIONS

    model = sequence_model()
    descriptions, traces = DESCRIPTIONS.reads, TRACES.reads
    callback = AutoPrecision(hardware="rtx2080ti", auto=AutoPlan(profile_steps=2), verbose=0)
    model.fit(padded_dataset([7, 7, 7]), verbose=0, callbacks=[callback])
    # The profile, the costs, the heuristic, the estimate and the plan read one description
    # and one trace at fit's batch signature; every further ask is answered from them.
    assert DESCRIPTIONS.reads - descriptions == 1
    assert TRACES.reads - traces == 1
    assert DESCRIPTIONS.hits + TRACES.hits > 0


@pytest.mark.parametrize("hardware", ["rtx4090", "local"])
def test_a_batch_size_asked_for_is_priced_with_fits_shapes_on_dict_and_dynamic_inputs(
    hardware, caplog
):
    model = sequence_model()
    if hardware == "local":
        hardware = local_with_fast_bfloat16()
    callback = AutoPrecision(
        hardware=hardware, auto=AutoPlan(profile_steps=1, batch_size=64), verbose=0
    )
    with caplog.at_level(logging.INFO, logger="autoprec"):
        model.fit(padded_dataset([7, 15, 9]), verbose=0, callbacks=[callback])
    assert "cost model unavailable" not in caplog.text
    assert "deciding from parameters" not in caplog.text
    assert callback.estimate is not None and callback.estimate.batch_size == 64
    assert callback.plan.metadata["start"]["predicted_step_ms"]


def test_the_decision_stays_within_its_budget_and_says_what_it_cost(capsys):
    model = sequence_model()
    hardware = local_with_fast_bfloat16()
    # No time at all: nothing is timed per layer (all predicted), nothing is raced, and fit
    # keeps the simpler plan.
    callback = AutoPrecision(
        hardware=hardware,
        auto=AutoPlan(profile_steps=1, decision_seconds=0.0),
        guard=None,
    )
    model.fit(padded_dataset([7, 15, 9]), verbose=0, callbacks=[callback])
    output = capsys.readouterr().out
    measured = callback.plan.metadata["measured"]
    assert measured["budget_seconds"] == 0.0 and measured["candidates_timed"] == 0
    assert "over the 0.0 s budget: keeping float32, the simpler plan" in measured["why"]
    assert set(callback.handle.dtypes.values()) == {"float32"}
    assert "autoprec: deciding took " in output and "(budget 0.0 s): 0 candidate(s)" in output
    assert "timing the whole train step" not in output
    # A budget: the race runs, and its rounds are counted in the decision's cost.
    model = sequence_model()
    callback = AutoPrecision(
        hardware=hardware, auto=AutoPlan(profile_steps=1, decision_seconds=120.0)
    )
    model.fit(padded_dataset([7, 15, 9] * 4), verbose=0, callbacks=[callback])
    measured = callback.plan.metadata["measured"]
    assert measured["budget_seconds"] == 120.0 and measured["candidates_timed"] >= 2
    assert 0 < measured["decision_seconds"] < 120.0
