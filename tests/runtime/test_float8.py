"""float8 at run time: plans, apply/restore, the callback's optimizer, saving, the guard (autoprec/runtime/float8.py)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import autoprec
from autoprec.errors import PlanError
from autoprec.layers import layer_paths, layer_policy
from autoprec.runtime.float8 import (
    extend_optimizer,
    float8_variables,
    keep_nested_float8_policies,
    lagging_scales,
)
from autoprec.runtime.loss_scale import current_loss_scale


def build_encoder(width: int = 32, sequence: int = 8, name: str = "encoder") -> keras.Model:
    """A Transformer-style block: Dense in, MultiHeadAttention (its EinsumDense layers), an MLP, a head."""
    inputs = keras.Input((sequence, 16))
    hidden = keras.layers.Dense(width, name="embed")(inputs)
    attended = keras.layers.MultiHeadAttention(2, width // 2, name="attention")(hidden, hidden)
    hidden = keras.layers.LayerNormalization(name="norm")(keras.layers.Add()([hidden, attended]))
    hidden = keras.layers.Dense(2 * width, activation="gelu", name="mlp_up")(hidden)
    hidden = keras.layers.Dense(width, name="mlp_down")(hidden)
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    outputs = keras.layers.Dense(3, activation="softmax", name="head")(pooled)
    return keras.Model(inputs, outputs, name=name)


def encoder_data(samples: int = 64, sequence: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, sequence, 16)).astype("float32")
    y = (x[:, :, 0].mean(axis=1) > 0).astype("int32") + (x[:, :, 1].mean(axis=1) > 0.3)
    return x, y.astype("int32")


def compiled_encoder(**kwargs) -> keras.Model:
    model = build_encoder(**kwargs)
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def float8_plan(model: keras.Model, **metadata) -> autoprec.PrecisionPlan:
    plan = autoprec.PrecisionPlan.uniform(model, "float8", metadata=metadata or None)
    return plan.with_dtype("head", "float32")


# ---------------------------------------------------------------- plans


def test_uniform_float8_is_float8_wherever_keras_allows_it():
    model = build_encoder()
    plan = autoprec.PrecisionPlan.uniform(model, "float8")
    classes = {path: info.class_name for path, info in plan.layer_info.items()}
    resolved = plan.resolve()
    for path, dtype in resolved.items():
        if classes[path] in ("Dense", "EinsumDense"):
            assert dtype == "float8", path
        else:
            assert dtype == "bfloat16", path
    assert plan.uses_float8 and not plan.uses_float16
    assert "float8" in plan.summary()


def test_float8_is_refused_on_a_layer_without_a_float8_path():
    model = build_encoder()
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16")
    with pytest.raises(PlanError, match="'norm'.*only for Dense and EinsumDense"):
        plan.with_dtype("norm", "float8")
    with pytest.raises(PlanError, match="float8 is only for Dense and EinsumDense"):
        autoprec.PrecisionPlan(
            {"norm": "float8"}, layer_info=plan.layer_info, model_name=model.name
        )
    with pytest.raises(PlanError, match="cannot be a plan's default"):
        autoprec.PrecisionPlan(default="float8")
    with pytest.raises(PlanError, match="without a float8 path"):
        plan.with_rule(class_name="LayerNormalization", dtype="float8")


def test_a_glob_or_a_rule_sets_float8_on_the_dense_layers_it_reaches_only():
    model = build_encoder()
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16").with_dtype("attention", "float8")
    assert plan.layers["attention/query_dense"] == "float8"
    assert plan.layers["attention/softmax"] == "bfloat16"
    ruled = autoprec.PrecisionPlan.uniform(model, "float32").with_rule(path="mlp_*", dtype="fp8")
    assert ruled.layers["mlp_up"] == ruled.layers["mlp_down"] == "float8"
    assert ruled.layers["norm"] == "float32"


def test_float8_plans_round_trip_through_json_and_diff(tmp_path):
    model = build_encoder()
    plan = float8_plan(model, float8_source="float16")
    plan.save(tmp_path / "plan.json")
    loaded = autoprec.PrecisionPlan.load(tmp_path / "plan.json")
    assert loaded == plan
    assert loaded.float8_source == "float16" and loaded.uses_float16
    change = autoprec.PrecisionPlan.uniform(model, "bfloat16").diff(plan)
    assert "bfloat16 -> float8" in str(change)


def test_the_keras_policy_map_names_float8_policies():
    model = build_encoder()
    policy_map = float8_plan(model).to_dtype_policy_map()
    assert policy_map["embed"].name == "float8_from_mixed_bfloat16"
    assert policy_map["head"].name == "float32"


# ---------------------------------------------------------------- apply / restore


def test_apply_quantizes_dense_layers_and_restore_takes_their_scales_out_of_training():
    model = build_encoder()
    before = len(model.trainable_variables)
    handle = autoprec.apply_plan(model, float8_plan(model))
    paths = layer_paths(model)
    assert paths["attention/query_dense"].quantization_mode == "float8"
    assert len(float8_variables(paths["embed"])) == 6
    assert len(model.trainable_variables) == before + 6 * 7
    assert autoprec.PrecisionPlan.from_model(model).layers["mlp_up"] == "float8"
    handle.restore()
    assert paths["embed"].quantization_mode is None
    assert len(model.trainable_variables) == before
    again = autoprec.apply_plan(model, float8_plan(model))  # quantized once, the variables reused
    assert len(model.trainable_variables) == before + 6 * 7
    again.restore()


def test_a_plan_made_before_float8_still_fits_the_quantized_model():
    model = build_encoder()
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16")
    autoprec.apply_plan(model, float8_plan(model))
    autoprec.apply_plan(model, plan, strict=True)  # scaling variables are not weights
    assert autoprec.layers.model_fingerprint(model) == plan.fingerprint


# ---------------------------------------------------------------- the callback


def test_the_callback_trains_float8_with_the_optimizer_state_kept_and_retraces_nothing_on_refit():
    model = compiled_encoder()
    x, y = encoder_data()
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    iterations = int(model.optimizer.iterations.numpy())
    kernel = model.get_layer("embed").kernel
    momentum = next(v for v in model.optimizer.variables if v.name == "embed_kernel_momentum")
    moment_before = keras.ops.convert_to_numpy(momentum).copy()
    callback = autoprec.AutoPrecision(float8_plan(model), verbose=0)
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[callback])
    assert int(model.optimizer.iterations.numpy()) == iterations + 4
    new_momentum = next(v for v in model.optimizer.variables if v.name == "embed_kernel_momentum")
    assert new_momentum is not momentum  # the optimizer was rebuilt for the new variables...
    assert not np.allclose(keras.ops.convert_to_numpy(new_momentum), 0.0)  # ...with its moments
    assert moment_before.shape == tuple(kernel.shape)
    scale = model.get_layer("embed").inputs_scale
    assert float(keras.ops.convert_to_numpy(scale)) != 1.0  # delayed scaling ran
    function = model.train_function
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, callbacks=[callback])
    assert model.train_function is function
    assert np.isfinite(model.evaluate(x, y, verbose=0)[0])


@pytest.mark.parametrize(("source", "scaled"), [("bfloat16", False), ("float16", True)])
def test_loss_scaling_goes_with_a_float16_source_only(source, scaled):
    model = compiled_encoder()
    x, y = encoder_data()
    plan = float8_plan(model, float8_source=source)
    model.fit(
        x,
        y,
        epochs=1,
        batch_size=32,
        verbose=0,
        callbacks=[autoprec.AutoPrecision(plan, verbose=0)],
    )
    assert ((current_loss_scale(model.optimizer) or 1.0) > 1.0) == scaled  # 1: steps skipped only
    assert layer_policy(model.get_layer("embed")).name == f"float8_from_mixed_{source}"


def test_extend_optimizer_is_a_no_op_when_every_variable_is_known():
    model = compiled_encoder()
    x, y = encoder_data()
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)
    assert extend_optimizer(model) is False
    autoprec.apply_plan(model, float8_plan(model))
    assert extend_optimizer(model) is True
    assert extend_optimizer(model) is False


# ---------------------------------------------------------------- saving


@pytest.mark.parametrize("saver", ["keras", "autoprec"])
def test_float8_sub_layers_of_attention_survive_save_and_load(tmp_path, saver):
    model = compiled_encoder()
    x, y = encoder_data()
    model.fit(
        x,
        y,
        epochs=1,
        batch_size=16,
        verbose=0,
        callbacks=[autoprec.AutoPrecision(float8_plan(model), verbose=0)],
    )
    path = tmp_path / "model.keras"
    if saver == "keras":
        model.save(path)
        loaded = keras.models.load_model(path)
    else:
        autoprec.save_model(model, path)
        loaded = autoprec.load_model(path)
    query = layer_paths(loaded)["attention/query_dense"]
    assert layer_policy(query).name == "float8_from_mixed_bfloat16"
    original_query = layer_paths(model)["attention/query_dense"]
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(query.inputs_scale),
        keras.ops.convert_to_numpy(original_query.inputs_scale),
    )
    np.testing.assert_allclose(
        loaded.predict(x[:8], verbose=0), model.predict(x[:8], verbose=0), atol=1e-5
    )
    loaded.fit(x, y, epochs=1, batch_size=16, verbose=0)


def test_a_container_map_follows_its_sub_layers_back_out_of_float8(tmp_path):
    model = build_encoder()
    handle = autoprec.apply_plan(model, float8_plan(model))
    attention = model.get_layer("attention")
    assert isinstance(attention.dtype_policy, keras.dtype_policies.DTypePolicyMap)
    handle.restore()
    assert keep_nested_float8_policies(model) == 1
    query_path = layer_paths(model)["attention/query_dense"].path
    assert attention.dtype_policy[query_path].name == "float32"
    model.compile("adam", "sparse_categorical_crossentropy")
    model.save(tmp_path / "back.keras")
    loaded = keras.models.load_model(tmp_path / "back.keras")
    assert layer_paths(loaded)["attention/query_dense"].quantization_mode is None


# ---------------------------------------------------------------- the guard


def test_the_guard_promotes_a_float8_layer_whose_scale_lags_a_growing_amax():
    model = compiled_encoder()
    x, y = encoder_data(samples=96)
    model.fit(x[:16], y[:16], epochs=1, verbose=0)
    growth = np.repeat(8.0 ** np.arange(6), 16).astype("float32")[:, None, None]  # x8 per step
    guard = autoprec.Guard(float8_check_every=1)
    callback = autoprec.AutoPrecision(float8_plan(model), guard=guard, verbose=0)
    model.fit(
        x * growth, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[callback]
    )
    promotions = [e for e in callback.plan.events if e["trigger"] == "float8_saturation"]
    assert promotions, callback.plan.events
    assert promotions[0]["layer"] == "embed"
    assert promotions[0]["from"] == "float8" and promotions[0]["to"] in ("bfloat16", "float32")
    assert "delayed" in promotions[0]["evidence"]
    assert callback.plan.layers["embed"] != "float8"


def test_steady_inputs_keep_their_scales():
    model = compiled_encoder()
    x, y = encoder_data()
    guard = autoprec.Guard(float8_check_every=1)
    callback = autoprec.AutoPrecision(float8_plan(model), guard=guard, verbose=0)
    model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[callback])
    assert not [e for e in callback.plan.events if e.get("trigger") == "float8_saturation"]
    paths = layer_paths(model)
    assert lagging_scales({"mlp_up": paths["mlp_up"]}) == {}


def test_an_infinite_input_batch_through_float8_layers_never_reaches_the_weights():
    model = compiled_encoder()
    x, y = encoder_data()
    x[20, 3, 2] = np.inf  # the second batch carries an infinity into the first Dense
    callback = autoprec.AutoPrecision(float8_plan(model), verbose=0)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    weights = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    assert all(np.isfinite(w).all() for w in weights)
    assert callback.plan.events, "the non-finite step was not seen"
    assert any(event["kind"] == "not_precision" for event in callback.plan.events)
