"""Composite layers that add their sub-layers' outputs in `call` run under any plan."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import zoo_models

import autoprec
from autoprec.errors import PlanError
from autoprec.layers import describe_model
from autoprec.runtime.composite import check_plan_runs, dtype_clashes, harmonize_outputs

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


@pytest.mark.parametrize("build", [functional_with_residual_pair, TwoBlockModel])
def test_mixed_sub_layers_crash_plain_keras_and_train_under_a_plan(build):
    x, y = data()
    mixed = {"pair/left": "bfloat16", "block/left": "bfloat16", "pair_2/right": "bfloat16"}
    plain = compiled(build())
    plain(x[:1])
    set_policies_by_hand(plain, {p: d for p, d in mixed.items() if p in describe_model(plain)})
    with pytest.raises((TypeError, ValueError), match="(?i)bfloat16|dtype|type"):
        plain.fit(x, y, epochs=1, batch_size=16, verbose=0)

    model = compiled(build())
    model(x[:1])
    plan = autoprec.PrecisionPlan.uniform(model, "float32")
    for path in mixed:
        if path in describe_model(model):
            plan = plan.with_dtype(path, "bfloat16")
    history = model.fit(
        x, y, epochs=2, batch_size=16, verbose=0, callbacks=[autoprec.AutoPrecision(plan)]
    )
    assert np.isfinite(history.history["loss"]).all()
    assert [clash.layer_dtype for clash in dtype_clashes(model)] == ["bfloat16"] * len(
        [p for p in mixed if p in describe_model(model)]
    )


def test_outputs_take_the_container_dtype_and_follow_later_policy_changes():
    x, _ = data()
    model = functional_with_residual_pair()
    model(x[:1])
    pair = model.get_layer("pair")
    pair.left.dtype_policy = "mixed_bfloat16"
    assert harmonize_outputs(model) == 6
    assert harmonize_outputs(model) == 0  # wrapped once
    assert keras.backend.standardize_dtype(pair.left(x).dtype) == "float32"
    # A later policy change (a promotion) is read when the layer is next called.
    pair.dtype_policy = "mixed_bfloat16"
    pair.right.dtype_policy = "mixed_bfloat16"
    pair.norm.dtype_policy = "mixed_bfloat16"
    assert keras.backend.standardize_dtype(pair.left(x).dtype) == "bfloat16"
    pair.left.dtype_policy = "float32"
    assert keras.backend.standardize_dtype(pair.left(x).dtype) == "bfloat16"
    assert [clash.layer for clash in dtype_clashes(model)] == ["pair/left"]
    assert "'pair/left' computes in float32 inside 'pair'" in dtype_clashes(model)[0].describe()


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


@pytest.mark.parametrize(
    "name",
    [
        name if name in ("bert", "gpt2") else pytest.param(name, marks=pytest.mark.slow)
        for name in sorted(zoo_models.ZOO)
    ],
)
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
