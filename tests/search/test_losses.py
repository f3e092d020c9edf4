"""Tests for autoprec.search.losses: what the compiled loss says about rounding the outputs."""

from __future__ import annotations

import keras

from autoprec.search import has_classification_loss, rounding_floor_outputs
from autoprec.search.floor import loss_names


def _model() -> keras.Model:
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(hidden))


def test_has_classification_loss_reads_strings_objects_and_functions():
    model = _model()
    for loss, expected in [
        ("sparse_categorical_crossentropy", True),
        (keras.losses.SparseCategoricalCrossentropy(from_logits=True), True),
        (keras.losses.binary_crossentropy, True),
        ("categorical_hinge", True),
        ("mse", False),
        (keras.losses.Huber(), False),
    ]:
        model.compile("adam", loss)
        assert has_classification_loss(model) is expected, loss
    model = _model()
    model.compile("adam", None)
    assert has_classification_loss(model) is False
    assert loss_names(model) == []


def test_a_regression_loss_floors_the_outputs_and_a_classification_loss_does_not():
    model = _model()
    assert rounding_floor_outputs(model, {"head"}) == {}  # not compiled: the loss is unknown
    model.compile("adam", "mse")
    reasons = rounding_floor_outputs(model, {"head"})
    assert list(reasons) == ["head"] and "'mse'" in reasons["head"] and "2^-9" in reasons["head"]
    model.compile("adam", "sparse_categorical_crossentropy")
    assert rounding_floor_outputs(model, {"head"}) == {}


def test_a_model_with_two_outputs_is_floored_unless_both_losses_classify():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8)(inputs)
    model = keras.Model(
        inputs,
        {
            "label": keras.layers.Dense(3, name="label")(hidden),
            "box": keras.layers.Dense(4, name="box")(hidden),
        },
    )
    model.compile("adam", {"label": "sparse_categorical_crossentropy", "box": "mae"})
    assert set(rounding_floor_outputs(model, {"label", "box"})) == {"label", "box"}
    assert sorted(loss_names(model)) == ["mae", "sparse_categorical_crossentropy"]
