"""Missing 16-bit kernels fall back before the first step (autoprec/runtime/kernels.py)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from reload_checks import assert_same_outputs

from autoprec import AutoPrecision, PrecisionPlan
from autoprec.layers import layer_paths
from autoprec.runtime.kernels import fallback_plan, find_missing_kernels


class LogGamma(keras.layers.Layer):
    """lgamma has a float16 but no bfloat16 kernel on TensorFlow's CPU."""

    def call(self, inputs):
        return keras.ops.cast(
            __import__("tensorflow").math.lgamma(inputs + keras.ops.cast(2.0, inputs.dtype)),
            inputs.dtype,
        )


class Determinant(keras.layers.Layer):
    """det has neither a float16 nor a bfloat16 kernel on TensorFlow's CPU."""

    def call(self, inputs):
        matrices = keras.ops.reshape(inputs, (-1, 2, 2))
        eye = keras.ops.eye(2, dtype=inputs.dtype)
        return keras.ops.reshape(__import__("tensorflow").linalg.det(matrices + eye), (-1, 1))


def _kernel_model():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(4, name="dense")(inputs)
    gamma = LogGamma(name="lgamma")(keras.layers.Activation("sigmoid")(hidden))
    determinant = Determinant(name="det")(gamma)
    outputs = keras.layers.Dense(1, name="out")(keras.layers.Concatenate()([gamma, determinant]))
    model = keras.Model(inputs, outputs, name="kernels")
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_missing_kernels_fall_back_before_the_first_step_and_are_logged(caplog):
    model = _kernel_model()
    plan = PrecisionPlan.uniform(model, "bfloat16").with_dtype("out", "float32")
    x = np.random.default_rng(0).uniform(size=(32, 4)).astype("float32")
    y = np.zeros((32, 1), "float32")
    callback = AutoPrecision(plan, verbose=0)
    with caplog.at_level("WARNING", logger="autoprec"):
        history = model.fit(x, y, epochs=1, batch_size=8, verbose=0, callbacks=[callback])
    paths = layer_paths(model)
    assert paths["lgamma"].compute_dtype == "float32"  # no bfloat16 lgamma on CPU
    assert paths["det"].compute_dtype == "float32"
    assert paths["dense"].compute_dtype == "bfloat16"
    fallen = {
        event["layer"]: event for event in callback.plan.events if event["kind"] == "missing_kernel"
    }
    assert set(fallen) == {"lgamma", "det"}
    assert fallen["det"]["from"] == "bfloat16" and fallen["det"]["to"] == "float32"
    assert "no bfloat16 kernel" in caplog.text
    assert np.isfinite(history.history["loss"][0])


def test_float16_falls_back_to_bfloat16_where_only_that_is_missing():
    model = _kernel_model()
    dtypes = {"dense": "float16", "lgamma": "float16", "det": "float16", "out": "float32"}
    missing = {item.path: item for item in find_missing_kernels(model, dtypes)}
    assert "lgamma" not in missing  # lgamma has a float16 kernel
    assert missing["det"].fallback == "float32"  # neither 16-bit kernel exists
    assert model.get_layer("det").compute_dtype == "float32"  # the check leaves policies alone


def _backbone_model(backbone, names, head_from=None):
    inputs = {name: keras.Input((6,), dtype="int32", name=name) for name in names}
    outputs = backbone(inputs)
    outputs = outputs[head_from] if head_from else outputs
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(outputs))
    model.compile(optimizer="sgd", loss="mse")
    return model


def _token_batch(names):
    rng = np.random.default_rng(0)
    return {
        name: np.ones((8, 6), "int32") if "mask" in name else rng.integers(1, 32, (8, 6))
        for name in names
    }


def test_a_mixtral_moe_block_whose_experts_differ_from_it_falls_back_with_its_decoder_and_reloads(
    tmp_path,
):
    import keras_hub

    backbone = keras_hub.models.MixtralBackbone(
        vocabulary_size=32,
        num_layers=1,
        num_query_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        num_key_value_heads=1,
        num_experts=2,
        top_k=1,
    )
    names = ["token_ids", "padding_mask"]
    model = _backbone_model(backbone, names)
    block = "mixtral_backbone/transformer_layer_0/sparse_moe_block"
    plan = PrecisionPlan.uniform(model, "bfloat16").with_dtype(f"{block}/expert_bank", "float32")
    found = find_missing_kernels(model, plan.resolve())
    decoder = block.rsplit("/", 1)[0]
    # The block's own routing mixes dtypes; then the decoder layer that adds the block's
    # float32 output to its bfloat16 residual does: both run in float32 with their
    # sub-layers alike, a plan Keras runs as it is saved.
    assert [(item.path, item.kind) for item in found] == [
        (block, "mixed_arithmetic"),
        (decoder, "mixed_arithmetic"),
    ]
    assert "its own arithmetic mixes float32 tensors it makes with bfloat16 ones" in found[0].error
    fallen = fallback_plan(plan, found)
    decoder_dtypes = {d for p, d in fallen.resolve().items() if p.startswith(decoder)}
    assert decoder_dtypes == {"float32"}
    assert fallen.resolve()["mixtral_backbone/token_embedding"] == "bfloat16"
    callback = AutoPrecision(fallen, verbose=0)
    saved = tmp_path / "mixtral.keras"
    batch = _token_batch(names)
    history = model.fit(
        batch,
        np.zeros((8, 6, 1), "float32"),
        batch_size=4,
        verbose=0,
        callbacks=[callback, keras.callbacks.ModelCheckpoint(saved)],
    )
    assert np.isfinite(history.history["loss"][0])
    reloaded = keras.models.load_model(saved)  # Keras' own door runs what trained
    assert_same_outputs(model, reloaded, batch)


def test_t5_attention_layers_are_checked_as_called_and_nothing_is_misreported(caplog):
    import keras_hub

    backbone = keras_hub.models.T5Backbone(
        vocabulary_size=32,
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        key_value_dim=4,
        dropout=0.0,
    )
    names = [
        "encoder_token_ids",
        "encoder_padding_mask",
        "decoder_token_ids",
        "decoder_padding_mask",
    ]
    model = _backbone_model(backbone, names, head_from="decoder_sequence_output")
    plan = PrecisionPlan.uniform(model, "bfloat16")
    with caplog.at_level("INFO", logger="autoprec"):
        found = find_missing_kernels(model, plan.resolve())
    changing = [item for item in found if item.kind != "check_failed"]
    assert changing == []  # no layer is claimed to lack a kernel
    for item in found:  # a call the check could not make is said so, and changes nothing
        assert f"kernel check could not call {item.path} alone" in caplog.text
    assert fallback_plan(plan, found).resolve() == plan.resolve()
    history = model.fit(
        _token_batch(names),
        np.zeros((8, 6, 1), "float32"),
        batch_size=4,
        verbose=0,
        callbacks=[AutoPrecision(fallback_plan(plan, found), verbose=0)],
    )
    assert np.isfinite(history.history["loss"][0])


class Jitter(keras.layers.Layer):
    """Adds float32 noise drawn in `call`: its own arithmetic mixes dtypes in 16-bit."""

    def call(self, inputs):
        return inputs + 0.1 * keras.random.normal(keras.ops.shape(inputs))


def _jitter_model():
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    hidden = keras.layers.Embedding(12, 4, name="embedding")(tokens)
    hidden = Jitter(name="jitter")(keras.layers.Dense(4, name="dense")(hidden))
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(hidden)
    return keras.Model(tokens, keras.layers.Dense(1, name="out")(pooled))


def _masked_lstm_model():
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    hidden = keras.layers.Embedding(12, 4, mask_zero=True, name="embedding")(tokens)
    hidden = keras.layers.Bidirectional(keras.layers.LSTM(3), name="bidirectional")(hidden)
    return keras.Model(tokens, keras.layers.Dense(1, name="out")(hidden))


def _lstm_plan(model):
    plan = PrecisionPlan.uniform(model, "bfloat16").with_dtype("bidirectional", "float32")
    for side in ("forward_layer", "backward_layer"):
        plan = plan.with_dtype(f"bidirectional/{side}/cell", "float16")
    return plan


@pytest.mark.parametrize(
    "build, make_plan, moved",
    [
        (_jitter_model, lambda model: PrecisionPlan.uniform(model, "bfloat16"), {"jitter"}),
        # Keras casts each recurrent call's inputs: the cells' own dtype runs as planned.
        (_masked_lstm_model, _lstm_plan, set()),
    ],
    ids=["noise_made_in_call", "masked_bidirectional_lstm"],
)
def test_inputs_of_unknown_length_are_checked_at_a_probe_length_before_fit_trains(
    build, make_plan, moved, caplog
):
    model = build()
    model.compile(optimizer="sgd", loss="mse")
    callback = AutoPrecision(make_plan(model), verbose=0)
    x = np.random.default_rng(0).integers(1, 12, size=(8, 11)).astype("int32")
    with caplog.at_level("INFO", logger="autoprec"):
        history = model.fit(
            x, np.zeros((8, 1), "float32"), batch_size=4, verbose=0, callbacks=[callback]
        )
    assert np.isfinite(history.history["loss"][0])
    assert "kernel check skipped" not in caplog.text
    events = [event for event in callback.plan.events if event["kind"] == "mixed_arithmetic"]
    assert {event["layer"] for event in events} == moved
    paths = layer_paths(model)
    assert all(paths[path].compute_dtype == "float32" for path in moved)
    assert paths["dense" if "jitter" in moved else "out"].compute_dtype == "bfloat16"
