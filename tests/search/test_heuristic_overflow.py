"""A float16 card without bfloat16: the exceptions to float16 are as narrow as the overflow."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import autoprec
from autoprec import PrecisionPlan, cost
from autoprec.search import compute_layers

#: Each test profiles a model (about 10 s on 2 cores) and some train it: CI's `long` stage.
pytestmark = pytest.mark.long

#: The share of uniform float16's predicted speedup over float32 a plan keeps.
KEPT_SHARE = 0.80
BATCH = 256
CARD = "rtx2080ti"


def _compiled(model: keras.Model) -> keras.Model:
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def encoder() -> tuple[keras.Model, np.ndarray, np.ndarray]:
    """Embedding and two attention blocks; the first block's query and key kernels scaled up."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((32,), dtype="int32")
    hidden = keras.layers.Embedding(512, 64, name="embed")(inputs)
    for block in range(2):
        attended = keras.layers.MultiHeadAttention(4, 16, name=f"block{block}_attention")(
            hidden, hidden
        )
        hidden = keras.layers.LayerNormalization(name=f"block{block}_norm")(hidden + attended)
        wide = keras.layers.Dense(256, activation="gelu", name=f"block{block}_up")(hidden)
        hidden = hidden + keras.layers.Dense(64, name=f"block{block}_down")(wide)
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    model = _compiled(keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(pooled)))
    attention = model.get_layer("block0_attention")
    for projection in (attention.query_dense, attention.key_dense):
        projection.kernel.assign(projection.kernel * 3000.0)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 512, (128, 32)).astype("int32")
    return model, x, (x[:, 0] % 4).astype("int32")


def mlp() -> tuple[keras.Model, np.ndarray, np.ndarray]:
    """Dense layers each followed by LayerNormalization; one Dense overflows float16."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((32,))
    hidden = inputs
    for index in range(16):
        hidden = keras.layers.Dense(512, activation="relu", name=f"dense{index}")(hidden)
        hidden = keras.layers.LayerNormalization(name=f"norm{index}")(hidden)
    model = _compiled(keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(hidden)))
    overflowing = model.get_layer("dense2")
    overflowing.kernel.assign(overflowing.kernel * 3e4)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 32)).astype("float32")
    return model, x, (x[:, 0] > 0).astype("int32") + 2 * (x[:, 1] > 0).astype("int32")


def cnn() -> tuple[keras.Model, np.ndarray, np.ndarray]:
    """Convolution, BatchNormalization and ReLU blocks; one convolution overflows float16."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    hidden = inputs
    for index in range(16):
        hidden = keras.layers.Conv2D(32, 3, padding="same", name=f"conv{index}")(hidden)
        hidden = keras.layers.BatchNormalization(name=f"bn{index}")(hidden)
        hidden = keras.layers.ReLU(name=f"relu{index}")(hidden)
    pooled = keras.layers.GlobalAveragePooling2D()(hidden)
    model = _compiled(keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(pooled)))
    overflowing = model.get_layer("conv3")
    overflowing.kernel.assign(overflowing.kernel * 3e4)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 16, 16, 3)).astype("float32")
    return model, x, (x[:, :8, :, 0].mean(axis=(1, 2)) > 0).astype("int32")


#: Each model, and the layers its plan must keep in float32: the overflow and what it reaches.
CASES = {
    "encoder": (
        encoder,
        {"block0_attention/key_dense", "block0_attention/softmax"},
    ),
    "mlp": (mlp, {"dense2", "norm2"}),
    "cnn": (cnn, {"conv3", "bn3"}),
}


def _speedup(model: keras.Model, plan: PrecisionPlan, table: cost.CostTable) -> float:
    return cost.estimate(model, plan, costs=table, batch_size=BATCH).speedup


def _planned(name: str):
    """The model, its data, the profile, the predicted costs and the heuristic plan."""
    build, expected = CASES[name]
    model, x, y = build()
    profile = autoprec.profile(model, (x, y), steps=2, batch_size=32, verbose=0)
    table = cost.predict_costs(model, CARD, batch_size=BATCH)
    plan = autoprec.heuristic_plan(model, profile, costs=table, hardware=CARD)
    return model, x, y, profile, table, plan, expected


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_plan_keeps_most_of_uniform_float16s_speedup(name):
    model, _, _, profile, table, plan, expected = _planned(name)
    uniform = _speedup(model, PrecisionPlan.uniform(model, "float16"), table)
    assert uniform > 1.2
    assert _speedup(model, plan, table) >= KEPT_SHARE * uniform
    kept = {path for path, dtype in plan.layers.items() if dtype == "float32"}
    # The overflow and what it reaches, nothing more: no block, no neighbour moves with them.
    assert expected <= kept & set(compute_layers(plan.layer_info))
    assert kept & set(compute_layers(plan.layer_info)) <= expected | set(
        profile.float16_unsafe_layers
    )
    for path in expected:
        assert plan.metadata["evidence"][path]["kind"] == "range"


def _loss(model: keras.Model, x: np.ndarray, y: np.ndarray) -> tf.Tensor:
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x, training=True)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_short_fit_under_the_plan_lowers_the_loss_as_float32s_does(name):
    """Plain SGD steps small enough to act linearly (each lowers the loss ~1 %), so the outcome
    follows the gradients, not the chaos of a few Adam steps: the plan's steps lower the loss as
    float32's do, none skipped (the loss scale starts where the gradients fit) and none flushed."""
    model, x, y, _, _, plan, _ = _planned(name)
    float32_copy = CASES[name][0]()[0]  # weighs the loss of a set of weights in float32
    weights = model.get_weights()
    float32_copy.set_weights(weights)
    with tf.GradientTape() as tape:
        start = _loss(float32_copy, x, y)
    gradients = tape.gradient(start, float32_copy.trainable_variables)
    squared = sum(float(tf.reduce_sum(tf.square(tf.convert_to_tensor(g)))) for g in gradients)
    learning_rate = 0.01 * float(start) / squared

    def fitted_loss(callbacks: list) -> float:
        model.set_weights(weights)
        model.compile(keras.optimizers.SGD(learning_rate), "sparse_categorical_crossentropy")
        model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        float32_copy.set_weights(model.get_weights())
        return float(_loss(float32_copy, x, y))

    float32_drop = float(start) - fitted_loss([])
    callback = autoprec.AutoPrecision(plan, verbose=0)
    plan_drop = float(start) - fitted_loss([callback])
    assert all(np.isfinite(weight).all() for weight in model.get_weights())
    assert int(model.optimizer.non_finite_steps.numpy()) == 0
    assert float32_drop > 0
    assert plan_drop >= 0.9 * float32_drop, (plan_drop, float32_drop)


def test_the_one_liner_on_a_float16_card_keeps_the_attention_logits_alone_in_float32():
    model, x, y = encoder()
    callback = autoprec.AutoPrecision(
        hardware=CARD, auto=autoprec.AutoPlan(profile_steps=2, batch_size=BATCH, remember=False)
    )
    history = model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[callback])
    assert np.isfinite(history.history["loss"]).all()
    table = cost.predict_costs(model, CARD, batch_size=BATCH)
    uniform = _speedup(model, PrecisionPlan.uniform(model, "float16"), table)
    assert callback.plan.metadata["predicted_speedup"] >= KEPT_SHARE * uniform
    evidence = callback.plan.metadata["evidence"]
    assert "attention logits of block0_attention" in evidence["block0_attention/softmax"]["reason"]
    assert not any(path.startswith("block1") for path in evidence)
