"""Tests for `autoprec.search.fidelity`: the trivial baseline, lengthened training, confirmation."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
from conftest import build_mlp

from autoprec._core.data import take_batches
from autoprec.errors import AutoprecError
from autoprec.plan import PrecisionPlan
from autoprec.search import Budget, Evaluator, SearchSettings, TrialRecord, search
from autoprec.search.evaluator import (
    check_reference,
    confirmation_reasons,
    longer_batches,
    trivial_baseline,
)


def binary_data(samples: int = 512):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 8)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int32")
    return (x[: samples * 3 // 4], y[: samples * 3 // 4]), (
        x[samples * 3 // 4 :],
        y[samples * 3 // 4 :],
    )


def binary_model(learning_rate: float = 3e-3) -> keras.Model:
    model = build_mlp(classes=2)
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def test_a_reference_that_cannot_learn_is_a_clear_error():
    model = build_mlp()
    model.compile(optimizer=keras.optimizers.SGD(1e-12), loss="sparse_categorical_crossentropy")
    train, val = binary_data()
    with pytest.raises(AutoprecError) as error:
        search(
            model,
            train,
            val,
            budget=Budget("val_loss", max_drop=0.05),
            hardware="rtx4090",
            n_trials=2,
            verbose=0,
            settings=SearchSettings(
                dtypes=["float32", "bfloat16"],
                steps_per_trial=2,
            ),
        )
    message = str(error.value)
    for words in (
        "val_loss",
        "after 16 train steps",
        "trivial baseline",
        "untrained",
        "steps_per_trial",
    ):
        assert words in message


def test_a_vacuous_budget_lengthens_training_until_the_baseline_misses_it(caplog):
    train, val = binary_data()
    with caplog.at_level(logging.INFO, logger="autoprec"):
        result = search(
            binary_model(),
            train,
            val,
            budget=Budget("val_accuracy", max_drop=0.1),
            hardware="rtx4090",
            n_trials=2,
            verbose=1,
            settings=SearchSettings(
                dtypes=["float32", "bfloat16"],
                steps_per_trial=1,
            ),
        )
    check = result.plan.metadata["search"]["fidelity_check"]
    assert check["requested_steps"] == 1 and check["train_steps"] > 1
    assert check["status"] == "meaningful" and check["baseline"] == 0.5
    assert result.reference_metric - 0.1 > 0.5  # chance misses the budget now
    assert result.plan.metadata["search"]["train_steps"] == check["train_steps"]
    assert "training longer" in caplog.text
    steps = {TrialRecord.from_trial(t).train_steps for t in result.study.trials}
    assert steps == {check["train_steps"]}


def test_trivial_baseline_is_chance_for_accuracy_and_untrained_otherwise():
    model = build_mlp()
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    train, val = binary_data(128)
    evaluator = Evaluator(
        model,
        take_batches(train, 32, 2, what="train"),
        take_batches(val, 32, None, what="val"),
    )
    assert trivial_baseline(evaluator, Budget("val_accuracy", max_drop=0.1)) == (
        pytest.approx(1 / 3),
        "chance (1/3 classes)",
    )
    value, kind = trivial_baseline(evaluator, Budget("val_loss", max_drop=0.1))
    assert kind == "untrained" and value == pytest.approx(evaluator.untrained_metrics()["loss"])
    evaluator.close()


def test_confirmation_reasons_low_fidelity_and_close_decisions():
    budget = Budget("val_accuracy", max_drop=0.1)
    assert confirmation_reasons(budget, 0.9, -0.09, 0.02, 200) == []
    assert confirmation_reasons(budget, 0.9, -0.01, 0.02, 200)[0].startswith("close decision")
    assert confirmation_reasons(budget, 0.9, -0.01, None, 200)[0].startswith("close decision")
    assert confirmation_reasons(budget, 0.9, -0.09, None, 20) == [
        "low fidelity (20 train steps < 64)"
    ]


def test_longer_batches_reads_arrays_again_and_repeats_an_iterator():
    x = np.arange(40, dtype="float32").reshape(20, 2)
    y = np.arange(20, dtype="float32")
    current = take_batches((x, y), 4, 2, what="train")
    longer = longer_batches((x, y), 4, 8, current)
    assert len(longer) == 8
    assert np.array_equal(longer[4][1], y[16:20]) and np.array_equal(longer[5][1], y[:4])
    iterator = iter([(x[:4], y[:4]), (x[4:8], y[4:8]), (x[8:12], y[8:12])])
    taken = take_batches(iterator, 4, 2, what="train")
    repeated = longer_batches(iterator, 4, 5, taken)
    assert [float(batch[1][0]) for batch in repeated] == [0.0, 4.0, 0.0, 4.0, 0.0]


def test_the_reference_s_validation_outputs_are_kept_at_its_final_fidelity():
    train, val = binary_data()
    model = binary_model()
    evaluator = Evaluator(
        model, take_batches(train, 32, 1, what="train"), take_batches(val, 32, None, what="val")
    )
    budget = Budget("val_accuracy", max_drop=0.1)
    metrics, check = check_reference(evaluator, budget, train, 32, 16, "auto")
    assert check.train_steps > check.requested_steps  # lengthened
    outputs = evaluator.float32_outputs()
    evaluator.train_and_evaluate(PrecisionPlan.uniform(model, "bfloat16"))
    assert evaluator.float32_outputs() is outputs  # kept, not trained again
    kept = evaluator.validation_metrics(outputs)
    assert kept["accuracy"] == pytest.approx(metrics["accuracy"])
    assert kept["loss"] == pytest.approx(metrics["loss"], rel=1e-5)
    evaluator.close()
