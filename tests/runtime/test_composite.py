"""Composite layers that add their sub-layers' outputs in `call`: one dtype where dtypes meet."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import zoo_models
from reload_checks import assert_same_outputs

import autoprec
from autoprec.errors import PlanError
from autoprec.layers import describe_model
from autoprec.runtime.check import alike_candidates, check_plan_runs, dtype_clashes

DTYPES = ("float32", "bfloat16", "float16")


@keras.saving.register_keras_serializable(package="autoprec_tests")
class ResidualPair(keras.layers.Layer):
    """A user's composite layer: two branches and a residual, added with plain `+`."""

    def __init__(self, width: int, **kwargs):
        super().__init__(**kwargs)
        self.width = width
        self.left = keras.layers.Dense(width, activation="relu")
        self.right = keras.layers.Dense(width)
        self.norm = keras.layers.LayerNormalization()

    def call(self, inputs):
        return self.norm(self.left(inputs) + self.right(inputs) + inputs)

    def get_config(self):
        return {**super().get_config(), "width": self.width}


@keras.saving.register_keras_serializable(package="autoprec_tests")
class TwoBlockModel(keras.Model):
    """A subclassed model whose own `call` adds a block's output to its input."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Dense(16)
        self.block = ResidualPair(16)
        self.head = keras.layers.Dense(3)

    def call(self, inputs):
        hidden = self.embed(inputs)
        return self.head(self.block(hidden) + hidden)


def functional_with_residual_pair() -> keras.Model:
    inputs = keras.Input((16,))
    hidden = ResidualPair(16, name="pair")(inputs)
    hidden = ResidualPair(16, name="pair_2")(hidden)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(hidden))


def data(samples: int = 32):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 16)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32")


def compiled(model: keras.Model) -> keras.Model:
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def random_plan(model: keras.Model, seed: int) -> autoprec.PrecisionPlan:
    """A plan giving every layer, containers included, a random dtype."""
    rng = np.random.default_rng(seed)
    plan = autoprec.PrecisionPlan.uniform(model, "float32")
    for path, info in describe_model(model).items():
        if info.follows is None:
            plan = plan.with_dtype(path, str(rng.choice(DTYPES)))
    return plan


def set_policies_by_hand(model: keras.Model, dtypes: dict[str, str]) -> None:
    paths = autoprec.layers.layer_paths(model)
    for path, dtype in dtypes.items():
        paths[path].dtype_policy = {"float32": "float32", "bfloat16": "mixed_bfloat16"}[dtype]


def mixed_arithmetic_events(plan: autoprec.PrecisionPlan) -> dict[str, tuple[str, str]]:
    return {
        event["layer"]: (event["from"], event["to"])
        for event in plan.events
        if event["kind"] == "mixed_arithmetic"
    }


@pytest.mark.parametrize("build", [functional_with_residual_pair, TwoBlockModel])
def test_a_plan_whose_dtypes_meet_in_a_layers_arithmetic_trains_in_one_dtype_there(build, tmp_path):
    x, y = data()
    mixed = {"pair/left": "bfloat16", "block/left": "bfloat16", "pair_2/right": "bfloat16"}
    plain = compiled(build())
    plain(x[:1])
    set_policies_by_hand(plain, {p: d for p, d in mixed.items() if p in describe_model(plain)})
    with pytest.raises((TypeError, ValueError), match="(?i)bfloat16|dtype|type"):
        plain.fit(x, y, epochs=1, batch_size=16, verbose=0)

    model = compiled(build())
    model(x[:1])
    planned = {path: dtype for path, dtype in mixed.items() if path in describe_model(model)}
    plan = autoprec.PrecisionPlan.uniform(model, "float32")
    for path, dtype in planned.items():
        plan = plan.with_dtype(path, dtype)
    callback = autoprec.AutoPrecision(plan)
    saved = tmp_path / "model.keras"
    history = model.fit(
        x,
        y,
        epochs=2,
        batch_size=16,
        verbose=0,
        callbacks=[callback, keras.callbacks.ModelCheckpoint(saved)],
    )
    assert np.isfinite(history.history["loss"]).all()
    # Each container that adds a bfloat16 branch to float32 tensors runs in its widest
    # planned dtype, float32, with its sub-layers alike: no dtype meets another.
    moved = mixed_arithmetic_events(callback.plan)
    containers = {path.rsplit("/", 1)[0] for path in planned}
    assert set(moved) == containers, callback.plan.events
    assert all(change == ("float32", "float32") for change in moved.values())
    assert dtype_clashes(model) == []
    # What trained is what Keras rebuilds: same dtypes, same predictions, bitwise.
    reloaded = keras.models.load_model(saved)
    assert_same_outputs(model, reloaded, x)


def test_a_sub_layer_moved_wider_takes_its_container_along_not_back():
    # A float16 block whose `left` branch is float32 (a range departure): the block runs
    # in float32 alike, never in float16 (the evidence for `left` is kept).
    x, y = data()
    model = compiled(functional_with_residual_pair())
    model(x[:1])
    plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("pair/left", "float32")
    callback = autoprec.AutoPrecision(plan)
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[callback])
    paths = autoprec.layers.layer_paths(model)
    assert {paths[p].compute_dtype for p in ("pair", "pair/left", "pair/right", "pair/norm")} == {
        "float32"
    }
    assert paths["pair_2/left"].compute_dtype == "float16"  # the other block keeps its plan
    assert mixed_arithmetic_events(callback.plan) == {"pair": ("float16", "float32")}


def test_alike_candidates_start_from_the_widest_planned_dtype():
    assert alike_candidates(["float16", "bfloat16"]) == ["bfloat16", "float32"]
    assert alike_candidates(["float16", "float32"]) == ["float32"]
    assert alike_candidates(["bfloat16"], container_dtype="float16") == ["float16", "float32"]
    assert alike_candidates(["bfloat16"], container_dtype="bfloat16") == ["float32"]


@keras.saving.register_keras_serializable(package="autoprec_tests")
class OverflowingPair(keras.layers.Layer):
    """A composite layer whose `left` branch overflows float16 on large inputs."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.left = keras.layers.Dense(4, kernel_initializer=keras.initializers.Constant(100.0))
        self.right = keras.layers.Dense(4)

    def call(self, inputs):
        return self.left(inputs) + self.right(inputs)


def test_a_guard_promotion_inside_a_composite_layer_moves_the_layer_with_it():
    inputs = keras.Input((4,))
    hidden = OverflowingPair(name="pair")(inputs)
    outputs = keras.layers.Dense(1, name="out", kernel_initializer="zeros")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(1e-12), loss="mse")
    x = np.concatenate([np.ones((16, 4)), np.full((32, 4), 1000.0)]).astype("float32")
    y = np.zeros((48, 1), "float32")
    callback = autoprec.AutoPrecision(autoprec.PrecisionPlan.uniform(model, "float16"))
    history = model.fit(x, y, batch_size=4, shuffle=False, verbose=0, callbacks=[callback])
    kinds = [event["kind"] for event in callback.plan.events]
    assert "promotion" in kinds, callback.plan.events
    paths = autoprec.layers.layer_paths(model)
    pair_dtypes = {paths[p].compute_dtype for p in ("pair", "pair/left", "pair/right")}
    assert len(pair_dtypes) == 1 and pair_dtypes != {"float16"}, pair_dtypes
    assert np.isfinite(history.history["loss"]).all()
    assert all(np.isfinite(weight).all() for weight in model.get_weights())


@keras.saving.register_keras_serializable(package="autoprec_tests")
class AddsAFloat32Constant(keras.layers.Layer):
    """A layer whose own arithmetic breaks under any 16-bit policy (a user's bug)."""

    def call(self, inputs):
        import tensorflow as tf

        return inputs + tf.ones_like(inputs, dtype="float32")


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's AddV2 rule")
def test_check_plan_runs_names_the_clash_when_a_plan_still_cannot_run():
    x, _ = data()
    inputs = keras.Input((16,))
    outputs = AddsAFloat32Constant(name="adds")(keras.layers.Dense(16, name="dense")(inputs))
    model = keras.Model(inputs, outputs)
    model(x[:1])
    autoprec.apply_plan(model, autoprec.PrecisionPlan.uniform(model, "float32"))
    check_plan_runs(model, x)
    autoprec.apply_plan(model, autoprec.PrecisionPlan.uniform(model, "bfloat16"))
    with pytest.raises(PlanError, match="cannot run under this plan.*AddsAFloat32Constant"):
        check_plan_runs(model, x)
    # apply_plan with a batch checks the same, and leaves the model as it was.
    with pytest.raises(PlanError, match="own arithmetic mixes dtypes"):
        autoprec.apply_plan(model, autoprec.PrecisionPlan.uniform(model, "float16"), x=x)
    assert model.get_layer("adds").compute_dtype == "bfloat16"


def _family(name: str):
    return name if name in ("bert", "gpt2") else pytest.param(name, marks=pytest.mark.slow)


@pytest.mark.parametrize("name", [_family(name) for name in sorted(zoo_models.ZOO)])
def test_random_plans_train_keras_hub_models(name):
    model, (x, y) = zoo_models.ZOO[name]()
    first = {k: v[:2] for k, v in x.items()} if isinstance(x, dict) else x[:2]
    model(first)
    for seed in (1, 2):
        plan = random_plan(model, seed)
        assert len(set(plan.resolve().values())) == 3
        history = model.fit(
            x,
            y,
            epochs=1,
            batch_size=16,
            steps_per_epoch=2,
            verbose=0,
            callbacks=[autoprec.AutoPrecision(plan)],
        )
        assert np.isfinite(history.history["loss"]).all(), (name, seed)
        check_plan_runs(model, x)
