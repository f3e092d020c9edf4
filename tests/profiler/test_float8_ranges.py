"""Float8 ranges of Dense/EinsumDense layers recorded by autoprec.profile on real models."""

from __future__ import annotations

import dataclasses

import keras
import ml_dtypes
import numpy as np
import pytest
from conftest import build_attention_model

from autoprec import numerics
from autoprec.errors import ProfileError
from autoprec.profiler import ProbeSession, Profile, profile
from autoprec.profiler.float8_ranges import Float8Ranges, Float8TensorRange


def _wide_mlp(features: int = 32) -> keras.Model:
    inputs = keras.Input((features,))
    hidden = keras.layers.Dense(256, activation="relu", name="wide")(inputs)
    hidden = keras.layers.Dense(256, activation="gelu", name="wider")(hidden)
    outputs = keras.layers.Dense(4, activation="softmax", name="head")(hidden)
    model = keras.Model(inputs, outputs, name="wide_mlp")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def _data(samples: int, features: int = 32) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, features)).astype("float32")
    return x, rng.integers(0, 4, samples)


def test_wide_mlp_fits_float8_and_every_tensor_is_measured_per_step():
    x, y = _data(320)
    prof = profile(_wide_mlp(), (x, y), steps=10, batch_size=32, verbose=0)
    assert prof.float8_unsafe_layers == () and prof.float8_unsafe_reasons == {}
    for path in ("wide", "wider", "head"):
        layer = prof.layers[path]
        assert layer.float8_safe is True and layer.float8_unsafe_reason is None
        ranges = layer.float8
        assert set(ranges.tensors) == {"inputs", "kernel", "output_gradients"}
        for name, item in ranges.tensors.items():
            assert item.format == ("float8_e5m2" if name == "output_gradients" else "float8_e4m3fn")
            assert item.steps == 10 and item.values > 0
            assert item.flush_fraction < numerics.FLOAT8_FLUSH_TOLERANCE
            assert 1.0 <= item.amax_growth < numerics.FLOAT8_MAX_AMAX_GROWTH
            assert item.saturation_fraction <= numerics.FLOAT8_SATURATION_TOLERANCE
    # The inputs of "wide" are the data itself: 10 batches of 32 rows, all non-zero.
    assert prof.layers["wide"].float8.inputs.values == 320 * 32
    assert prof.layers["wide"].float8.inputs.amax == pytest.approx(np.abs(x).max())
    # The kernel is read every step before the update: 10 copies of 32 x 256.
    assert prof.layers["wide"].float8.kernel.values == 10 * 32 * 256
    # The head's gradient is taken before its softmax (the loss reads the logits).
    assert prof.layers["head"].float8.output_gradients.values == 320 * 4
    lines = prof.summary().splitlines()
    assert "float8: 0 of 3 Dense/EinsumDense layers unsafe" in lines[0]
    assert lines[1].split()[-8:] == ["f8", "ftz", "f8", "sat", "amax", "x/step", "f8", "safe"]
    assert all(line.endswith("yes") for line in lines[3:])


def test_outlier_input_features_flush_the_small_inputs_to_zero():
    x, y = _data(256)
    x[:, :3] *= 1e4  # three features 1e4 times larger than the rest
    prof = profile(_wide_mlp(), (x, y), steps=8, batch_size=32, verbose=0)
    wide = prof.layers["wide"]
    inputs = wide.float8.inputs
    # What ml_dtypes does to the same values, scaled per tensor as Keras does.
    scaled = x * np.float32(448.0 / np.abs(x).max())
    quantized = scaled.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    truth = np.count_nonzero((quantized == 0) & (x != 0)) / np.count_nonzero(x)
    assert truth > 2 * numerics.FLOAT8_FLUSH_TOLERANCE
    assert inputs.flush_fraction == pytest.approx(truth, rel=0.05)
    assert wide.float8_safe is False and prof.float8_unsafe_layers[0] == "wide"
    reason = prof.float8_unsafe_reasons["wide"]
    assert "inputs" in reason and "E4M3" in reason and "round to zero" in reason
    assert f"{inputs.flush_fraction:.2%}" in reason
    assert wide.float8.kernel.flush_fraction < numerics.FLOAT8_FLUSH_TOLERANCE
    table = prof.summary()
    # Downstream layers inherit huge activations (their gradients spread too).
    assert f"float8: {len(prof.float8_unsafe_layers)} of 3 Dense/EinsumDense layers" in table
    row = next(line for line in table.splitlines() if line.startswith("wide "))
    assert row.endswith("NO") and f"{wide.float8.flush_fraction:.2%}" in row


def _growing_batches(steps: int, growth: float):
    x, y = _data(32 * steps)
    for step in range(steps):
        rows = slice(32 * step, 32 * (step + 1))
        yield x[rows], y[rows], np.full(32, growth**step, "float32")


def test_gradients_growing_each_step_saturate_the_delayed_scale():
    # Sample weights growing 3x per batch: every gradient grows 3x per step.
    data = _growing_batches(steps=8, growth=3.0)
    prof = profile(_wide_mlp(), data, steps=8, verbose=0)
    for path in ("wide", "wider", "head"):
        gradients = prof.layers[path].float8.output_gradients
        assert gradients.steps == 8
        assert 2.0 < gradients.amax_growth < 4.5
        assert gradients.saturation_fraction > numerics.FLOAT8_SATURATION_TOLERANCE
        assert prof.layers[path].float8.inputs.amax_growth < 2.0
    assert set(prof.float8_unsafe_layers) == {"wide", "wider", "head"}
    reason = prof.float8_unsafe_reasons["wider"]
    assert "output gradients" in reason and "E5M2" in reason and "clipped" in reason


def test_conv2d_gets_no_float8_ranges_and_einsum_dense_does():
    images = np.random.default_rng(0).normal(size=(64, 8, 8, 1)).astype("float32")
    labels = np.arange(64) % 3
    cnn = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(3, name="head"),
        ]
    )
    cnn.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True))
    prof = profile(cnn, (images, labels), steps=4, batch_size=16, verbose=0)
    conv = prof.layers["conv"]
    assert conv.float8 is None and conv.float8_safe is None and conv.float8_unsafe_reason is None
    head = prof.layers["head"].float8
    # The head's inputs are the flattened ReLU outputs of the convolution (zeros left out).
    assert head.inputs.values == int(conv.activation.histogram.sum()) > 0
    assert "conv" not in prof.float8_unsafe_layers

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 8, 8)).astype("float32"), np.arange(32) % 2
    attention = build_attention_model()
    attention.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    prof = profile(attention, (x, y), steps=3, batch_size=16, verbose=0)
    einsum = {
        path: layer for path, layer in prof.layers.items() if layer.class_name == "EinsumDense"
    }
    assert len(einsum) == 4  # query, key, value and output projections
    for layer in einsum.values():
        assert set(layer.float8.tensors) == {"inputs", "kernel", "output_gradients"}
    assert all(
        layer.float8 is None
        for layer in prof.layers.values()
        if layer.class_name not in ("Dense", "EinsumDense")
    )


def test_frozen_kernels_float8_policies_and_steps_per_execution():
    inputs = keras.Input((16,))
    frozen = keras.layers.Dense(32, activation="relu", name="frozen")
    frozen.trainable = False
    hidden = frozen(inputs)
    outputs = keras.layers.Dense(4, activation="tanh", name="f8", dtype="float8_from_float32")(
        hidden
    )
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="mse", steps_per_execution=2)
    x = np.random.default_rng(0).normal(size=(32 * 6, 16)).astype("float32")
    prof = profile(model, (x, np.zeros((32 * 6, 4), "float32")), steps=6, verbose=0)
    kernel = prof.layers["frozen"].float8.kernel  # not trained: read once on the host
    assert kernel.values == 16 * 32 and kernel.steps == 0 and kernel.amax_growth is None
    assert kernel.amax == pytest.approx(float(np.abs(frozen.kernel.numpy()).max()))
    # A float8 layer runs Keras' quantized call: its inputs are recorded there.
    f8 = prof.layers["f8"].float8
    assert set(f8.tensors) == {"inputs", "kernel", "output_gradients"}
    assert f8.inputs.values == int(prof.layers["frozen"].activation.histogram.sum())
    assert f8.inputs.steps == 3  # one observation per execution of two steps


def test_probe_session_without_float8_ranges_records_none():
    x, y = _data(64)
    model = _wide_mlp()
    with ProbeSession(model) as session:
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
        prof = session.collect()
    assert all(layer.float8 is None for layer in prof.layers.values())
    assert "f8 safe" not in prof.summary()
    session = ProbeSession(model)
    with session:
        with pytest.raises(ProfileError, match="before install"):
            session.enable_float8_ranges()


def test_float8_ranges_survive_json_and_old_profiles_still_load(tmp_path):
    x, y = _data(128)
    x[:, 0] *= 1e4
    prof = profile(_wide_mlp(), (x, y), steps=4, batch_size=32, verbose=0)
    loaded = Profile.load(prof.save(tmp_path / "profile.json"))
    assert loaded.to_dict() == prof.to_dict()
    for path, layer in prof.layers.items():
        assert loaded.layers[path].float8 == layer.float8
    assert loaded.float8_unsafe_reasons == prof.float8_unsafe_reasons != {}

    old = prof.to_dict()
    for layer in old["layers"].values():
        del layer["float8"]
    before = Profile.from_dict(old, "old.json")
    assert all(layer.float8 is None for layer in before.layers.values())
    assert before.float8_unsafe_layers == () and "f8 safe" not in before.summary()

    broken = prof.to_dict()
    broken["layers"]["wide"]["float8"]["kernel"]["format"] = "float8_e4m3"
    with pytest.raises(ProfileError, match=r"layers\['wide'\]\.float8\.kernel\.format"):
        Profile.from_dict(broken, "broken.json")
    broken["layers"]["wide"]["float8"] = {"weights": {}}
    with pytest.raises(ProfileError, match="unknown float8 tensor"):
        Profile.from_dict(broken, "broken.json")


def test_float8_verdict_names_the_first_failing_tensor_and_check():
    def item(**changes) -> Float8TensorRange:
        base = Float8TensorRange("float8_e4m3fn", 2.0, 100, 0, 0.0, 0.0, 1.1, 8)
        return dataclasses.replace(base, **changes)

    assert Float8Ranges(item(), item(), item(format="float8_e5m2")).safe
    ranges = Float8Ranges(
        inputs=item(amax_growth=3.0), output_gradients=item(format="float8_e5m2", nonfinite=2)
    )
    assert ranges.unsafe_reason.startswith("its output gradients hold 2 non-finite")
    assert "grew 3x in one step" in Float8Ranges(inputs=item(amax_growth=3.0)).unsafe_reason
    assert "kernel" in Float8Ranges(kernel=item(flush_fraction=0.2)).unsafe_reason
    unmeasured = Float8Ranges(kernel=item(saturation_fraction=None, amax_growth=None))
    assert unmeasured.safe and unmeasured.saturation_fraction is None
    assert unmeasured.amax_growth is None and unmeasured.flush_fraction == 0.0
