"""The automatic mode (autoprec/_auto.py): the first batch read inside fit, and costs timed at it."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest

from autoprec import AutoPrecision, PrecisionPlan, cost
from autoprec._auto import FirstBatchSize, decide_plan, has_classification_loss, race_candidates
from autoprec._core.rounds import judge_rounds
from autoprec.callback import AutoPlan
from autoprec.errors import PlanError
from autoprec.hardware import resolve_hardware


def _sequence_model() -> keras.Model:
    """Inputs `{"tokens", "features"}` whose sequence dimension is `None`."""
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    features = keras.Input((None, 4), name="features")
    embedded = keras.layers.Embedding(50, 4, name="embedding")(tokens)
    summed = keras.layers.Add(name="add")([embedded, features])
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(summed)
    model = keras.Model({"tokens": tokens, "features": features}, keras.layers.Dense(2)(pooled))
    model.compile(optimizer="adam", loss="mse")
    return model


def _sequences(samples: int, length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(length)
    return {
        "tokens": rng.integers(0, 50, (samples, length)).astype("int32"),
        "features": rng.normal(size=(samples, length, 4)).astype("float32"),
    }


def _padded_dataset(lengths: list[int]):
    """A `tf.data` dataset of 8-sample batches padded to each batch's length: unknown when traced."""
    import tensorflow as tf

    def samples():
        for length in lengths:
            for _ in range(8):
                x = {
                    "tokens": np.ones((length,), "int32"),
                    "features": np.ones((length, 4), "float32"),
                }
                yield x, np.zeros((2,), "float32")

    signature = (
        {
            "tokens": tf.TensorSpec((None,), tf.int32),
            "features": tf.TensorSpec((None, 4), tf.float32),
        },
        tf.TensorSpec((2,), tf.float32),
    )
    return tf.data.Dataset.from_generator(samples, output_signature=signature).padded_batch(8)


def test_first_batch_reader_gives_inputs_shaped_as_the_first_batch():
    model = _sequence_model()
    reader = FirstBatchSize(model)
    assert reader.read_inputs() is None  # no step yet
    reader.install()
    model.fit(_sequences(20, 12), np.zeros((20, 2), "float32"), batch_size=8, verbose=0)
    inputs = reader.read_inputs()
    reader.remove()
    assert reader.read() == 8
    assert {key: value.shape for key, value in inputs.items()} == {
        "tokens": (8, 12),
        "features": (8, 12, 4),
    }
    assert inputs["tokens"].dtype == "int32" and inputs["features"].dtype == "float32"
    assert reader.read_inputs(batch_size=3)["features"].shape == (3, 12, 4)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.data padded batches")
def test_first_batch_reader_records_a_padded_length_the_traced_step_leaves_unknown():
    model = _sequence_model()
    reader = FirstBatchSize(model)
    reader.install()
    model.fit(_padded_dataset([7, 15, 9]), verbose=0)  # the first batch is 7 long, not 15
    inputs = reader.read_inputs()
    reader.remove()
    assert {key: value.shape for key, value in inputs.items()} == {
        "tokens": (8, 7),
        "features": (8, 7, 4),
    }


def test_decide_plan_times_costs_at_the_sample_given(caplog):
    model = _sequence_model()
    with caplog.at_level(logging.WARNING, logger="autoprec"):
        _, without = decide_plan(model, None, hardware="rtx4090", batch_size=8)
    assert without is None and "pass a batch of inputs (`x=...`)" in caplog.text
    kept = {}
    for length in (6, 18):
        sample = _sequences(8, length)
        plan, estimate = decide_plan(model, None, hardware="rtx4090", batch_size=8, sample=sample)
        assert estimate is not None and estimate.batch_size == 8
        direct = cost.estimate(model, plan, "rtx4090", batch_size=8, x=sample)
        assert estimate.activation_bytes_per_sample == direct.activation_bytes_per_sample
        kept[length] = estimate.activation_bytes_per_sample
    assert kept[18] > 2.5 * kept[6]  # the activations of three times the sequence


def test_automatic_mode_measures_costs_on_a_padded_dataset(caplog):
    model = _sequence_model()
    callback = AutoPrecision(auto=AutoPlan(profile_steps=1), verbose=0)
    with caplog.at_level(logging.INFO, logger="autoprec"):
        model.fit(_padded_dataset([7, 15, 9]), verbose=0, callbacks=[callback])
    assert "cost model unavailable" not in caplog.text
    assert callback.estimate is not None and callback.estimate.source == "measured"
    assert callback.estimate.batch_size == 8
    at_seven = cost.estimate(model, callback.plan, "rtx4090", batch_size=8, x=_sequences(8, 7))
    assert callback.estimate.activation_bytes_per_sample == at_seven.activation_bytes_per_sample


def test_automatic_mode_gets_costs_for_a_keras_hub_bert_fed_dicts(caplog):
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=512,
        num_layers=2,
        num_heads=4,
        hidden_dim=64,
        intermediate_dim=128,
        max_sequence_length=32,
    )
    model = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=4, preprocessor=None)
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    rng = np.random.default_rng(0)
    x = {
        "token_ids": rng.integers(0, 512, (16, 32)).astype("int32"),
        "segment_ids": rng.integers(0, 2, (16, 32)).astype("int32"),
        "padding_mask": np.ones((16, 32), "int32"),
    }
    y = rng.integers(0, 4, (16,))
    callback = AutoPrecision(hardware="rtx4090", auto=AutoPlan(profile_steps=1), verbose=0)
    with caplog.at_level(logging.WARNING, logger="autoprec"):
        history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    assert "cost model unavailable" not in caplog.text
    assert callback.estimate is not None and callback.estimate.batch_size == 8
    assert callback.estimate.layer_seconds["bert_backbone/token_embedding"] > 0
    assert np.isfinite(history.history["loss"]).all()


# ---------------------------------------------------------------- whole steps timed inside fit


def _mlp(loss: str = "sparse_categorical_crossentropy") -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(256, activation="relu", name="hidden"),
            keras.layers.LayerNormalization(name="norm"),
            keras.layers.Dense(256, activation="relu", name="hidden_2"),
            keras.layers.Dense(4, name="head"),
        ]
    )
    model.compile("adam", loss)
    return model


def _mlp_data(samples: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((samples, 64)).astype("float32"), rng.integers(0, 4, samples)


def test_has_classification_loss_reads_strings_objects_and_functions():
    model = _mlp()
    for loss, expected in [
        ("sparse_categorical_crossentropy", True),
        (keras.losses.SparseCategoricalCrossentropy(from_logits=True), True),
        (keras.losses.binary_crossentropy, True),
        ("mse", False),
        (keras.losses.Huber(), False),
    ]:
        model.compile("adam", loss)
        assert has_classification_loss(model) is expected, loss
    model.compile("adam", None)
    assert has_classification_loss(model) is False


def test_race_candidates_are_uniform_as_keras_sets_them_and_the_per_layer_plan():
    model = _mlp()
    model(np.zeros((1, 64), "float32"))
    plan = PrecisionPlan.uniform(model, "float32").with_dtype("hidden", "bfloat16")
    cpu = resolve_hardware("cpu-avx512-bf16")
    assert cpu.is_fast("bfloat16") and not cpu.is_fast("float16")
    candidates = race_candidates(model, plan, None, cpu)
    assert list(candidates) == ["float32", "mixed_bfloat16", "per-layer"]
    # A classification loss: every layer as Keras' global mixed_bfloat16 sets it.
    assert set(candidates["mixed_bfloat16"].resolve().values()) == {"bfloat16"}
    assert candidates["per-layer"] is plan
    # A regression loss: the output layer stays float32 in the uniform plan.
    model.compile("adam", "mse")
    uniform = race_candidates(model, plan, None, cpu)["mixed_bfloat16"].resolve()
    assert uniform["head"] == "float32" and uniform["hidden"] == "bfloat16"
    # A per-layer plan that is one of the uniform ones is timed once, under the simpler name.
    assert list(race_candidates(model, PrecisionPlan.uniform(model, "float32"), None, cpu)) == [
        "float32",
        "mixed_bfloat16",
    ]
    # float16 only where it is fast and a profile shows every layer's ranges fit it.
    assert "mixed_float16" not in race_candidates(model, plan, None, resolve_hardware("rtx4090"))


def test_the_one_liner_keeps_the_plan_whose_whole_step_measured_fastest(capsys):
    model = _mlp()
    x, y = _mlp_data()
    callback = AutoPrecision(auto=AutoPlan(profile_steps=2))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
    measured = callback.plan.metadata["measured"]
    names = list(measured["rounds_ms"])
    assert names[0] == "float32" and len(names) >= 2
    assert measured["rounds"] >= 5
    # The kept plan is the verdict on the recorded rounds, and it is what the model runs.
    verdict = judge_rounds(measured["rounds_ms"], names.index)
    assert measured["winner"] == verdict.leader
    if verdict.leader == "float32":
        assert set(callback.handle.dtypes.values()) == {"float32"}
    elif verdict.leader == "mixed_bfloat16":
        assert set(callback.handle.dtypes.values()) == {"bfloat16"}
    assert all(np.isfinite(w).all() for w in model.get_weights())
    printed = capsys.readouterr().out
    assert "timed the whole train step of float32" in printed
    assert f"keeping {verdict.leader}" in printed


def test_the_one_liner_times_nothing_where_costs_are_predicted_or_timing_is_off():
    x, y = _mlp_data(256)
    for callback in (
        AutoPrecision(hardware="rtx4090", auto=AutoPlan(profile_steps=2), verbose=0),
        AutoPrecision(auto=AutoPlan(profile_steps=2, timing_rounds=0), verbose=0),
    ):
        model = _mlp()
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
        assert "measured" not in callback.plan.metadata


def test_timing_rounds_must_be_a_count_or_zero():
    with pytest.raises(PlanError, match="timing_rounds must be an integer >= 1 or 0"):
        AutoPlan(timing_rounds=-1)
    assert "timing_rounds=3" in repr(AutoPlan(timing_rounds=3))
