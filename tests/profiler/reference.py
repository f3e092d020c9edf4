"""NumPy reference statistics and a hand-built profile, shared by the profiler's tests."""

from __future__ import annotations

import numpy as np
import pytest

from autoprec import numerics
from autoprec.profiler import LayerProfile, Profile, TensorStats


def reference_stats(values) -> dict:
    """Statistics computed with NumPy alone (frexp exponents), independently of autoprec."""
    flat = np.asarray(values, dtype=np.float32).ravel()
    finite = flat[np.isfinite(flat)]
    nonzero = finite[finite != 0]
    _, exponents = np.frexp(nonzero)
    histogram = np.zeros(numerics.HISTOGRAM_BINS, dtype=np.int64)
    np.add.at(histogram, exponents - 1 - numerics.HISTOGRAM_MIN_EXPONENT, 1)
    magnitude = np.abs(finite).astype(np.float64)
    return {
        "count": flat.size,
        "zeros": int(np.sum(finite == 0)),
        "nonfinite": int(flat.size - finite.size),
        "nan": int(np.isnan(flat).sum()),
        "max_abs": float(magnitude.max()) if magnitude.size else 0.0,
        "min_nonzero_abs": float(np.abs(nonzero).min()) if nonzero.size else None,
        "sum_abs": float(magnitude.sum()),
        "sum_squares": float(np.sum(magnitude**2)),
        "histogram": histogram,
    }


def assert_matches_reference(
    stats: TensorStats, values, rtol: float = 1e-5, min_rtol: float = 1e-5
) -> None:
    reference = reference_stats(values)
    assert stats.count == reference["count"]
    assert stats.zeros == reference["zeros"]
    assert stats.nonfinite == reference["nonfinite"]
    assert stats.nan == reference["nan"]
    np.testing.assert_array_equal(stats.histogram, reference["histogram"])
    assert stats.max_abs == pytest.approx(reference["max_abs"], rel=rtol)
    if reference["min_nonzero_abs"] is None:
        assert stats.min_nonzero_abs is None
    else:
        assert stats.min_nonzero_abs == pytest.approx(reference["min_nonzero_abs"], rel=min_rtol)
    assert stats.sum_abs == pytest.approx(reference["sum_abs"], rel=rtol)
    assert stats.sum_squares == pytest.approx(reference["sum_squares"], rel=rtol)


def synthetic_profile() -> Profile:
    """A two-layer profile: a float16-safe Dense and an attention layer whose logits overflow."""

    def stats(values):
        histogram, zeros, nonfinite = numerics.exponent_histogram(values)
        flat = np.abs(np.asarray(values, np.float64))
        return TensorStats(
            count=len(values),
            zeros=zeros,
            nonfinite=nonfinite,
            max_abs=float(flat.max()),
            min_nonzero_abs=float(flat[flat > 0].min()),
            sum_abs=float(flat.sum()),
            sum_squares=float((flat**2).sum()),
            histogram=histogram,
        )

    safe = LayerProfile(
        path="encoder/dense",
        class_name="Dense",
        dtype="float32",
        activations={"output": stats([0.5, -1.0, 0.0, 3.0])},
        activation_gradients={"output": stats([1e-3, -2e-4, 5e-5])},
        weights={"kernel": stats([0.1, -0.2])},
        weight_gradients={"kernel": stats([1e-4, 3e-3])},
        internals={},
    )
    risky = LayerProfile(
        path="attention",
        class_name="MultiHeadAttention",
        dtype="float32",
        activations={"output": stats([0.1, 0.2])},
        activation_gradients={},
        weights={},
        weight_gradients={},
        internals={"attention_logits": stats([1e5, -3.0, 2.0])},
    )
    return Profile({"encoder/dense": safe, "attention": risky}, steps=4, model_name="demo")


def cross_backend_model():
    """Dense, MultiHeadAttention, Add, LayerNormalization, pooling and a linear head (no softmax).

    Built the same under every Keras backend; the head has no softmax, so the
    loss reads the outputs on every backend (TensorFlow alone would read a
    softmax's logits).
    """
    import keras

    inputs = keras.Input((6, 8))
    hidden = keras.layers.Dense(8, name="proj")(inputs)
    attended = keras.layers.MultiHeadAttention(
        num_heads=2, key_dim=4, use_bias=False, name="attention"
    )(hidden, hidden)
    hidden = keras.layers.Add(name="residual")([hidden, attended])
    hidden = keras.layers.LayerNormalization(name="norm")(hidden)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(hidden)
    outputs = keras.layers.Dense(2, name="head")(pooled)
    return keras.Model(inputs, outputs, name="cross_backend")
