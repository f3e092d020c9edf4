"""Graph constants made from an operand's dtype follow that operand's plan (runtime/policy_map.py)."""

from __future__ import annotations

import keras
import numpy as np
import zoo_models
from reload_checks import assert_same_outputs

import autoprec
from autoprec.runtime.policy_map import align_graph_constants


@keras.saving.register_keras_serializable(package="autoprec_tests")
class ScaledBackbone(keras.Model):
    """Builds its graph in `__init__`, scaling by a constant made in its operand's dtype."""

    def __init__(self, dtype=None, **kwargs):
        inputs = keras.Input((4,), name="features")
        hidden = keras.layers.Dense(8, dtype=dtype, name="dense")(inputs)
        hidden = hidden * keras.ops.cast(keras.ops.sqrt(8.0), hidden.dtype)
        outputs = keras.layers.Dense(1, dtype=dtype, name="out")(hidden)
        super().__init__(inputs, outputs, dtype=dtype, **kwargs)

    def get_config(self):
        return {"name": self.name, "dtype": keras.dtype_policies.serialize(self.dtype_policy)}


def _constants(model: keras.Model) -> list[str]:
    dtypes = []
    for nodes in model._nodes_by_depth.values():
        for node in nodes:
            if not isinstance(node.operation, keras.layers.Layer):
                dtypes += [
                    keras.backend.standardize_dtype(value.dtype)
                    for value in keras.tree.flatten((node.arguments.args, node.arguments.kwargs))
                    if keras.ops.is_tensor(value) and not isinstance(value, keras.KerasTensor)
                ]
    return dtypes


def test_a_constant_made_from_its_operands_dtype_follows_the_plan_and_comes_back(tmp_path):
    model = ScaledBackbone(name="scaled")
    assert _constants(model) == ["float32"]
    handle = autoprec.apply_plan(model, autoprec.PrecisionPlan.uniform(model, "bfloat16"))
    assert _constants(model) == ["bfloat16"]
    assert align_graph_constants(model) == 1  # idempotent: from the graph as built
    handle.restore()
    assert _constants(model) == ["float32"]

    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    model.compile(optimizer="sgd", loss="mse")
    saved = tmp_path / "scaled.keras"
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16")
    model.fit(
        x,
        x[:, :1],
        batch_size=8,
        verbose=0,
        callbacks=[autoprec.AutoPrecision(plan, verbose=0), keras.callbacks.ModelCheckpoint(saved)],
    )
    assert_same_outputs(model, keras.models.load_model(saved), x)


def test_a_plain_functional_model_keeps_its_saved_constants():
    # Keras rebuilds a plain functional model from its saved config, constants as saved.
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(4, name="dense")(inputs)
    hidden = hidden * keras.ops.cast(keras.ops.sqrt(8.0), hidden.dtype)
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(hidden))
    autoprec.apply_plan(model, autoprec.PrecisionPlan.uniform(model, "bfloat16"))
    assert _constants(model) == ["float32"]
    assert align_graph_constants(model) == 0


def test_a_keras_hub_gemma_scales_its_embeddings_in_the_plans_dtype():
    model, (x, _) = zoo_models.RELOAD_ZOO["gemma"]()
    model({key: value[:2] for key, value in x.items()})
    backbone = model.backbone
    assert _constants(backbone) == ["float32"]
    autoprec.apply_plan(model, autoprec.PrecisionPlan.uniform(model, "bfloat16"))
    assert _constants(backbone) == ["bfloat16"]
