"""Tests for `FirstBatchSize`: the first batch's size and input shapes, read inside fit."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from decision.auto_models import padded_dataset, sequence_model, sequences

from autoprec.decision import FirstBatchSize


def test_first_batch_reader_gives_inputs_shaped_as_the_first_batch():
    model = sequence_model()
    reader = FirstBatchSize(model)
    assert reader.read_inputs() is None  # no step yet
    reader.install()
    model.fit(sequences(20, 12), np.zeros((20, 2), "float32"), batch_size=8, verbose=0)
    inputs = reader.read_inputs()
    reader.remove()
    assert reader.read() == 8
    assert {key: value.shape for key, value in inputs.items()} == {
        "tokens": (8, 12),
        "features": (8, 12, 4),
    }
    assert inputs["tokens"].dtype == "int32" and inputs["features"].dtype == "float32"
    assert reader.read_inputs(batch_size=3)["features"].shape == (3, 12, 4)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.data padded batches")
def test_first_batch_reader_records_a_padded_length_the_traced_step_leaves_unknown():
    model = sequence_model()
    reader = FirstBatchSize(model)
    reader.install()
    model.fit(padded_dataset([7, 15, 9]), verbose=0)  # the first batch is 7 long, not 15
    inputs = reader.read_inputs()
    reader.remove()
    assert {key: value.shape for key, value in inputs.items()} == {
        "tokens": (8, 7),
        "features": (8, 7, 4),
    }
