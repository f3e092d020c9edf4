"""Keras helpers: strategy scope, fresh optimizers, compile arguments (autoprec/_core/models.py)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from conftest import build_mlp

from autoprec._core import models
from autoprec.errors import AutoprecError


def test_fresh_optimizer_has_the_class_and_config_but_no_state_or_scaling():
    model = build_mlp()
    model.compile(
        optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
        loss="mse",
    )
    model.fit(np.ones((4, 8)), np.ones((4, 3)), verbose=0)
    fresh = models.fresh_optimizer(model.optimizer)
    assert type(fresh) is keras.optimizers.SGD
    assert fresh.momentum == 0.9
    assert not fresh.built
    assert type(models.fresh_optimizer(None)) is keras.optimizers.Adam


def test_compile_arguments_rebuild_a_copy_compiled_alike():
    model = build_mlp()
    model.compile(optimizer=keras.optimizers.RMSprop(0.01), loss="mse", metrics=["mae"])
    arguments = models.compile_arguments(model, "search")
    copy = keras.models.clone_model(model)
    models.recompile(copy, arguments)
    assert type(copy.optimizer) is keras.optimizers.RMSprop
    assert copy.optimizer is not arguments["optimizer"]
    logs = copy.fit(np.ones((4, 8)), np.ones((4, 3)), verbose=0).history
    assert "mae" in logs


def test_compile_arguments_of_an_uncompiled_model_say_what_to_do():
    with pytest.raises(AutoprecError, match="search: model .* is not compiled. Compile it"):
        models.compile_arguments(build_mlp(), "search")


def test_strategy_scope_is_a_no_op_without_a_strategy_and_enters_one_otherwise():
    import tensorflow as tf

    model = build_mlp()
    with models.strategy_scope(model):
        pass
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        distributed = build_mlp()
    with models.strategy_scope(distributed):
        assert tf.distribute.get_strategy() is strategy


def test_swap_attribute_undoes_to_the_instance_or_the_class_attribute():
    layer = keras.layers.Dense(2)
    original_call = layer.call
    undo = models.swap_attribute(layer, "call", "wrapped")
    assert layer.call == "wrapped"
    undo()
    assert "call" not in vars(layer) and layer.call == original_call
    undo()  # twice is harmless
    layer.custom = 1
    undo = models.swap_attribute(layer, "custom", 2)
    assert layer.custom == 2
    undo()
    assert layer.custom == 1
