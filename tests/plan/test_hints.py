"""Error hints: close names, and the layer a follower follows (autoprec/plan/rules.py)."""

from __future__ import annotations

import keras

from autoprec.layers import describe_model
from autoprec.plan.rules import did_you_mean, followed_source, follower_message


def test_did_you_mean_names_the_closest_candidates():
    assert did_you_mean("dense_9", ["dense", "dense_1", "dropout"]) == (
        " (did you mean 'dense_1', 'dense'?)"
    )
    assert did_you_mean("softmax", ["Softmax", "Dense"]) == " (did you mean 'Softmax'?)"
    assert did_you_mean("attention", ["conv2d", "dense"]) == ""


def test_followed_source_walks_the_chain_and_stops_on_a_cycle(cnn):
    infos = describe_model(cnn)
    followers = {path: info.follows for path, info in infos.items() if info.follows}
    assert followed_source("flatten", followers) == "batch_normalization"
    assert followed_source("dense", followers) == "dense"
    assert followed_source("a", {"a": "b", "b": "a"}) in {"a", "b"}


def test_follower_message_names_the_kind_and_the_layer_to_set(cnn):
    infos = describe_model(cnn)
    followers = {path: info.follows for path, info in infos.items() if info.follows}
    assert follower_message("flatten", followers, infos) == (
        "'flatten' is a pass-through layer (Flatten); it follows the dtype of "
        "'batch_normalization'. Set 'batch_normalization' instead."
    )
    assert follower_message("dropout", {"dropout": "dense"}, {}) == (
        "'dropout' is a pass-through layer; it follows the dtype of 'dense'. Set 'dense' instead."
    )


def test_follower_message_names_a_nested_model():
    inner = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, name="inner_dense")], name="inner"
    )
    outer = keras.Sequential(
        [keras.Input((4,)), inner, keras.layers.Dense(2, name="head")], name="outer"
    )
    infos = describe_model(outer)
    followers = {path: info.follows for path, info in infos.items() if info.follows}
    assert followers == {"inner": "inner/inner_dense"}
    assert follower_message("inner", followers, infos) == (
        "'inner' is a nested model (Sequential); it follows the dtype of 'inner/inner_dense'. "
        "Set 'inner/inner_dense' instead."
    )
