"""Loss scaling with a floor, fixed scales and step skipping, on real training runs (autoprec/runtime/loss_scale.py)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from autoprec.errors import PlanError
from autoprec.runtime.loss_scale import (
    FlooredLossScaleOptimizer,
    LossScale,
    current_loss_scale,
    is_dynamic_scale,
    resolve_loss_scale,
    scales_loss,
    step_skipping_optimizer,
    wrap_optimizer,
)

#: Non-finite steps in a row: more than the ~164 halvings that take Keras' floorless
#: scale from 2**15 to 0.0.
_BAD_STEPS = 180


def _model(optimizer) -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="dense")])
    model.compile(optimizer=optimizer, loss="mse")
    model.get_layer("dense").set_weights([np.full((4, 1), 0.5, "float32"), np.zeros(1, "float32")])
    return model


def _batches(steps: int, poisoned: bool) -> tuple[np.ndarray, np.ndarray]:
    x = np.ones((steps, 4), "float32")
    if poisoned:
        x[:] = np.nan  # every gradient non-finite
    return x, np.zeros((steps, 1), "float32")


def _finite(model) -> bool:
    return all(np.isfinite(weight).all() for weight in model.get_weights())


def test_the_floor_holds_under_persistent_overflow_where_keras_scale_collapses():
    floored = _model(FlooredLossScaleOptimizer(keras.optimizers.SGD(0.01), floor=1.0))
    plain = _model(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01)))
    for model in (floored, plain):
        model.fit(*_batches(_BAD_STEPS, poisoned=True), batch_size=1, verbose=0)
    assert current_loss_scale(floored.optimizer) == 1.0
    assert float(plain.optimizer.dynamic_scale.numpy()) == 0.0  # Keras' scale has no floor
    assert int(floored.optimizer.non_finite_steps.numpy()) == _BAD_STEPS
    assert int(floored.optimizer.consecutive_non_finite_steps.numpy()) == _BAD_STEPS
    for model in (floored, plain):
        model.fit(*_batches(1, poisoned=False), batch_size=1, verbose=0)
    assert _finite(floored)
    assert not _finite(plain)  # gradients scaled by 0.0, unscaled by 1/0.0
    assert int(floored.optimizer.consecutive_non_finite_steps.numpy()) == 0
    assert int(floored.optimizer.non_finite_steps.numpy()) == _BAD_STEPS


def test_a_fixed_scale_skips_bad_steps_and_applies_unscaled_updates():
    fixed = _model(FlooredLossScaleOptimizer(keras.optimizers.SGD(0.01), 128.0, fixed=True))
    reference = _model(keras.optimizers.SGD(0.01))
    fixed.fit(*_batches(3, poisoned=True), batch_size=1, verbose=0)
    assert current_loss_scale(fixed.optimizer) == 128.0  # never halved
    assert np.allclose(fixed.get_weights()[0], 0.5)  # the bad steps changed nothing
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 4)).astype("float32"), rng.normal(size=(16, 1)).astype("float32")
    for model in (fixed, reference):
        model.fit(x, y, batch_size=4, shuffle=False, verbose=0)
    for mine, theirs in zip(fixed.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    assert not is_dynamic_scale(fixed.optimizer)


def test_step_skipping_wraps_without_scaling():
    skipping = _model(step_skipping_optimizer(keras.optimizers.SGD(0.01)))
    reference = _model(keras.optimizers.SGD(0.01))
    assert not scales_loss(skipping.optimizer)
    assert current_loss_scale(skipping.optimizer) is None
    skipping.fit(*_batches(2, poisoned=True), batch_size=1, verbose=0)
    assert int(skipping.optimizer.non_finite_steps.numpy()) == 2 and _finite(skipping)
    x, y = np.ones((8, 4), "float32"), np.ones((8, 1), "float32")
    for model in (skipping, reference):
        model.fit(x, y, batch_size=4, shuffle=False, verbose=0)
    np.testing.assert_allclose(skipping.get_weights()[0], reference.get_weights()[0], rtol=1e-6)


def test_a_dynamic_scale_doubles_after_its_growth_steps():
    model = _model(
        FlooredLossScaleOptimizer(keras.optimizers.SGD(0.0), 8.0, dynamic_growth_steps=4)
    )
    assert current_loss_scale(model.optimizer) == 8.0  # before it is built
    model.fit(*_batches(8, poisoned=False), batch_size=1, verbose=0)
    assert current_loss_scale(model.optimizer) == 32.0
    assert is_dynamic_scale(model.optimizer)
    model.fit(*_batches(1, poisoned=True), batch_size=1, verbose=0)
    assert current_loss_scale(model.optimizer) == 16.0


def test_wrap_optimizer_wraps_once_and_replaces_a_step_skipping_wrapper():
    model = _model(keras.optimizers.Adam())
    adam = model.optimizer
    assert wrap_optimizer(model, None, "test") is adam
    assert not scales_loss(model.optimizer)
    assert wrap_optimizer(model, None, "test") is None  # already wrapped
    settings = LossScale(initial=1024.0, floor=4.0, growth_steps=10)
    assert wrap_optimizer(model, settings, "test") is adam  # scaling around the same Adam
    wrapped = model.optimizer
    assert isinstance(wrapped, FlooredLossScaleOptimizer) and wrapped.inner_optimizer is adam
    assert (wrapped.floor, wrapped.fixed, current_loss_scale(wrapped)) == (4.0, False, 1024.0)
    assert wrap_optimizer(model, settings, "test") is None and model.optimizer is wrapped
    model.fit(*_batches(4, poisoned=False), batch_size=2, verbose=0)
    assert _finite(model)
    fixed = _model(keras.optimizers.SGD())
    wrap_optimizer(fixed, LossScale(initial=64.0, floor=None, dynamic=False), "test")
    assert fixed.optimizer.fixed and fixed.optimizer.floor is None


def test_wrapping_a_model_without_an_optimizer_says_to_compile():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    with pytest.raises(PlanError, match="PlanCallback: the model has no optimizer; compile it"):
        wrap_optimizer(model, LossScale(), "PlanCallback")
    with pytest.raises(PlanError, match="no optimizer"):
        wrap_optimizer(model, None, "PlanCallback")


def test_the_optimizer_round_trips_through_keras_serialization():
    optimizer = FlooredLossScaleOptimizer(keras.optimizers.SGD(0.1), 256.0, floor=2.0, fixed=True)
    config = keras.saving.serialize_keras_object(optimizer)
    restored = keras.saving.deserialize_keras_object(config)
    assert isinstance(restored, FlooredLossScaleOptimizer)
    assert (restored.floor, restored.fixed, float(restored.initial_scale)) == (2.0, True, 256.0)
    assert isinstance(restored.inner_optimizer, keras.optimizers.SGD)
    with pytest.raises(ValueError, match="below the floor"):
        FlooredLossScaleOptimizer(keras.optimizers.SGD(), initial_scale=0.5, floor=1.0)


def test_resolve_loss_scale_and_its_settings():
    assert resolve_loss_scale("dynamic", "AutoPrecision") == LossScale()
    assert resolve_loss_scale(128, "AutoPrecision") == LossScale(128.0, floor=None, dynamic=False)
    assert resolve_loss_scale(None, "AutoPrecision") is None
    settings = LossScale(initial=4.0, floor=2.0**-10)
    assert resolve_loss_scale(settings, "AutoPrecision") is settings
    assert LossScale.from_config(settings.get_config()) == settings
    with pytest.raises(PlanError, match="AutoPrecision: loss_scale='static' is not valid"):
        resolve_loss_scale("static", "AutoPrecision")
    with pytest.raises(PlanError, match="floor 8 is above initial 4"):
        LossScale(initial=4.0, floor=8.0)
    with pytest.raises(PlanError, match="growth_steps must be an integer >= 1"):
        LossScale(growth_steps=0)
    with pytest.raises(PlanError, match="initial must be a positive number"):
        LossScale(initial=float("inf"))


def _gradient_heavy_model() -> tuple[keras.Model, np.ndarray, np.ndarray]:
    """A Dense stack whose float16 gradients pass 65504 at Keras' initial scale 2**15."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, name="hidden"),
            keras.layers.Dense(1, name="out"),
        ]
    )
    model.compile(keras.optimizers.SGD(1e-6), "mse")
    x = np.ones((32, 8), "float32")
    return model, x, np.full((32, 1), 300.0, "float32")  # loss gradients of ~600 a value


def test_a_dynamic_scale_starts_where_the_profiled_float16_gradients_fit():
    import autoprec

    model, x, y = _gradient_heavy_model()
    profile = autoprec.profile(model, (x, y), steps=1, batch_size=32, verbose=0)
    plan = autoprec.heuristic_plan(model, profile, hardware="rtx2080ti")
    start = plan.metadata["loss_scale"]["initial"]
    assert start == profile.loss_scale_for(
        path for path, dtype in plan.resolve().items() if dtype == "float16"
    )
    assert start < 2.0**15  # 2**15 overflows these gradients
    weights = model.get_weights()
    callback = autoprec.AutoPrecision(plan, verbose=0)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[callback])
    assert int(model.optimizer.non_finite_steps.numpy()) == 0  # the first step is not skipped
    assert current_loss_scale(model.optimizer) == start
    assert callback.plan.metadata["loss_scale"]["initial"] == start  # kept in the plan it ends
    callback.restore()
    # An explicit LossScale is used as given: Keras' 2**15 overflows and skips the first step.
    model.set_weights(weights)
    explicit = autoprec.AutoPrecision(plan, loss_scale=LossScale(), verbose=0)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[explicit])
    assert int(model.optimizer.non_finite_steps.numpy()) == 1


@pytest.mark.parametrize(
    "bad",
    [
        [np.array([np.inf, 0.0]), np.array([-np.inf])],  # their sum is NaN, still caught
        [np.array([1.0, np.nan]), np.array([2.0])],
        [np.array([1.0, 2.0]), np.array([np.inf])],
    ],
)
def test_the_finiteness_check_catches_every_nan_or_infinity(bad):
    optimizer = step_skipping_optimizer(keras.optimizers.SGD(0.1))
    optimizer.build([keras.Variable(np.zeros(2)), keras.Variable(np.zeros(1))])
    assert not bool(optimizer.check_finite([np.asarray(g, "float32") for g in bad]))
    assert not bool(optimizer.check_finite([np.asarray(g, "float16") for g in bad]))


def test_float16_gradients_whose_float16_sum_would_overflow_pass_the_check():
    optimizer = step_skipping_optimizer(keras.optimizers.SGD(0.1))
    optimizer.build([keras.Variable(np.zeros(4)), keras.Variable(np.zeros(1))])
    large = np.full(4, 60000.0, "float16")  # finite; summed in float16 they would reach inf
    assert bool(optimizer.check_finite([keras.ops.convert_to_tensor(large), None]))
    assert bool(optimizer.check_finite([]))
