"""Tests for autoprec.cost.estimate: step time, speedup, casts, memory and plan forms."""

from __future__ import annotations

import math

import keras
import pytest
from conftest import build_mlp

from autoprec import cost, hardware
from autoprec.errors import HardwareError, PlanError
from autoprec.layers import layer_paths

GIB = 1024**3


def _wide_mlp() -> keras.Model:
    inputs = keras.Input((512,))
    hidden = keras.layers.Dense(1024, activation="relu")(inputs)
    hidden = keras.layers.Dense(1024, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(16)(hidden))


def test_predicted_estimate_is_monotone_in_batch_size():
    model = _wide_mlp()
    table = cost.predict_costs(model, "rtx4090", batch_size=64)
    previous = 0.0
    for batch_size in (1, 8, 64, 512, 4096):
        step = cost.estimate(model, "bfloat16", costs=table, batch_size=batch_size).step_seconds
        assert step > previous
        previous = step
        direct = cost.estimate(model, "bfloat16", "rtx4090", batch_size=batch_size)
        assert direct.step_seconds > 0


def test_dtype_the_device_cannot_run_is_infeasible():
    no_half = hardware.profile_from_dict(
        {
            "name": "fp32-only",
            "kind": "gpu",
            "float32_flops": 1e13,
            "memory_bandwidth": 5e11,
            "memory_bytes": 8 * GIB,
        }
    )
    model = build_mlp()
    est = cost.estimate(model, "float16", no_half, batch_size=32)
    assert math.isinf(est.step_seconds) and est.speedup == 0.0
    assert "dense" in est.infeasible_layers
    assert cost.estimate(model, "float32", no_half, batch_size=32).speedup == pytest.approx(1.0)


def test_max_batch_size_fits_8gb(cnn):
    est = cost.estimate(cnn, "float16", "rtx4060ti-8gb", batch_size=32)
    assert est.memory_bytes == 8 * GIB
    largest = est.max_batch_size()
    usable = 8 * GIB * cost.USABLE_MEMORY_FRACTION
    assert largest > 32
    assert est.fixed_memory_bytes + largest * est.activation_bytes_per_sample <= usable
    assert est.fixed_memory_bytes + (largest + 1) * est.activation_bytes_per_sample > usable
    float32 = cost.estimate(cnn, "float32", "rtx4060ti-8gb", batch_size=32)
    assert float32.activation_bytes_per_sample > est.activation_bytes_per_sample
    assert float32.max_batch_size() < largest
    assert est.max_batch_size(4 * GIB) < largest
    assert est.max_batch_size(1) == 0


class _PlanLike:
    def __init__(self, layers):
        self.layers = layers


def test_estimate_accepts_plans_dicts_and_counts_casts(mlp):
    table = cost.predict_costs(mlp, "rtx4090", batch_size=64)
    uniform = cost.estimate(mlp, {path: "float32" for path in layer_paths(mlp)}, costs=table)
    assert uniform.cast_seconds == 0 and uniform.speedup == pytest.approx(1.0)
    mixed = {"dense": "float16", "dense_1": "float32", "dense_2": "float16"}
    from_object = cost.estimate(mlp, _PlanLike(mixed), costs=table)
    from_dict = cost.estimate(mlp, mixed, costs=table)
    assert from_object.step_seconds == pytest.approx(from_dict.step_seconds)
    assert from_dict.cast_seconds > 0
    with pytest.raises(PlanError):
        cost.estimate(mlp, {"dense": "float4"}, costs=table)
    # A table without float8 times makes a float8 layer infeasible.
    no_float8 = cost.predict_costs(mlp, "rtx4090", batch_size=64, dtypes=["float32", "bfloat16"])
    assert cost.estimate(mlp, {"dense": "float8"}, costs=no_float8).infeasible_layers == ("dense",)
    assert cost.estimate(mlp, {"dense": "float8"}, costs=table).infeasible_layers == ()
    with pytest.raises(HardwareError):
        cost.estimate(mlp, "float32", "rtx9999")


def test_estimate_of_a_dict_input_model_traces_the_batch_it_is_given(bert_classifier, bert_batch):
    with pytest.raises(PlanError, match="unknown dimensions"):
        cost.estimate(bert_classifier, "bfloat16", "rtx4090", batch_size=16)
    est = cost.estimate(bert_classifier, "bfloat16", "rtx4090", batch_size=16, x=bert_batch)
    assert est.step_seconds > 0 and est.float32_step_seconds > 0 and not est.infeasible_layers
    assert est.layer_seconds["bert_backbone/token_embedding"] > 0
    # Activations of 32-token sequences: more than the 3 x 32 input ids alone.
    assert est.activation_bytes_per_sample > 3 * 32 * 4


def _transformer_block() -> keras.Model:
    inputs = keras.Input((16, 64))
    attended = keras.layers.MultiHeadAttention(num_heads=4, key_dim=16, name="attention")(
        inputs, inputs
    )
    hidden = keras.layers.LayerNormalization(name="norm")(inputs + attended)
    wide = keras.layers.Dense(128, activation="gelu", name="ffn_in")(hidden)
    hidden = hidden + keras.layers.Dense(64, name="ffn_out")(wide)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(hidden)
    return keras.Model(inputs, keras.layers.Dense(4, name="head")(pooled))


def _mlp() -> keras.Model:
    inputs = keras.Input((64,))
    hidden = keras.layers.Dense(128, activation="relu", name="hidden_1")(inputs)
    hidden = keras.layers.Dense(128, activation="relu", name="hidden_2")(hidden)
    return keras.Model(inputs, keras.layers.Dense(4, name="head")(hidden))


def _cnn() -> keras.Model:
    inputs = keras.Input((16, 16, 3))
    hidden = keras.layers.Conv2D(16, 3, activation="relu", name="conv")(inputs)
    hidden = keras.layers.BatchNormalization(name="batch_norm")(hidden)
    hidden = keras.layers.GlobalAveragePooling2D(name="pool")(hidden)
    hidden = keras.layers.Dense(32, activation="relu", name="dense")(hidden)
    return keras.Model(inputs, keras.layers.Dense(4, name="head")(hidden))


#: Each model with a plan mixing float8 (where the device has it), bfloat16 and float16.
_PLAN_MODELS = {
    "transformer": (_transformer_block, {"ffn_in": "float8", "ffn_out": "float8", "*": "bfloat16"}),
    "mlp": (_mlp, {"hidden_1": "float8", "hidden_2": "float16", "head": "float32"}),
    "cnn": (_cnn, {"conv": "float16", "batch_norm": "float32", "dense": "float8"}),
}


@pytest.mark.parametrize("device", ["rtx5090", "rtx3090"])
@pytest.mark.parametrize("name", sorted(_PLAN_MODELS))
def test_a_plans_predicted_speedup_is_what_estimate_reports(name, device):
    import numpy as np

    import autoprec

    build, dtypes = _PLAN_MODELS[name][0], dict(_PLAN_MODELS[name][1])
    model = build()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, *model.input_shape[1:])).astype("float32")
    y = rng.integers(0, 4, (64,))
    # The one-liner predicts its plan's speedup before the plan is applied.
    callback = autoprec.AutoPrecision(hardware=device)
    model.fit(x, y, batch_size=32, epochs=1, callbacks=[callback], verbose=0)
    predicted = callback.plan.metadata["predicted_speedup"]
    after = cost.estimate(model, callback.plan, device, batch_size=32, x=x[:32])
    assert predicted > 0 and after.speedup == pytest.approx(predicted, rel=1e-9)
    assert not after.infeasible_layers
    # A mixed plan: what estimate says before it is applied, it says while the model runs it.
    fresh = build()
    fallback = dtypes.pop("*", "float32")
    plan = autoprec.PrecisionPlan.uniform(fresh, fallback)
    for path, dtype in dtypes.items():
        plan = plan.with_dtype(path, dtype if device == "rtx5090" else "bfloat16")
    before = cost.estimate(fresh, plan, device, batch_size=32, x=x[:32])
    autoprec.apply_plan(fresh, plan)
    applied = cost.estimate(fresh, plan, device, batch_size=32, x=x[:32])
    assert before.cast_seconds > 0 or fallback != "float32"
    assert applied.speedup == pytest.approx(before.speedup, rel=1e-9) and before.speedup > 0
    assert applied.cast_seconds == pytest.approx(before.cast_seconds, rel=1e-9)
    assert applied.memory_bytes == before.memory_bytes
    assert applied.training_memory_bytes == pytest.approx(before.training_memory_bytes)
