"""Tests for autoprec._backends.jax: the compiled functions calibration times on JAX.

The checks run in one child process under Keras' JAX backend
(`jax_child.run_jax_child`), with TensorFlow made unimportable.
"""

from __future__ import annotations

import textwrap

import pytest
from backends.jax_child import run_jax_child

pytest.importorskip("jax")

CHILD = textwrap.dedent(
    """
    import json, sys
    sys.modules["tensorflow"] = None
    import jax, keras, numpy as np
    from autoprec._backends import jax as jax_timing, timing_backend

    dense = keras.layers.Dense(4, dtype="mixed_bfloat16")
    outputs, gradients, state = jax_timing.layer_step(
        dense, [keras.ops.ones((2, 8), dtype="bfloat16")], {}
    )()
    norm = keras.layers.BatchNormalization()
    _, _, updated = jax_timing.layer_step(norm, [keras.ops.ones((4, 3))], {})()
    draw = jax_timing.random_tensor((3, 2), "float16", np.random.default_rng(0))
    again = jax_timing.random_tensor((3, 2), "float16", np.random.default_rng(0))
    there, back = jax_timing.cast_step("bfloat16", 64)()
    print("RESULT " + json.dumps({
        "dispatch": timing_backend("calibrate()") is jax_timing,
        "versions": jax_timing.versions() == {"jax": jax.__version__},
        "output_dtype": str(outputs[0].dtype),
        "kernel_gradient_dtype": str(gradients[0][0].dtype),
        "input_gradient_shape": list(gradients[1][0].shape),
        "moving_statistics_updated": len(updated),
        "draw": [str(draw.dtype), bool(np.array_equal(np.asarray(draw), np.asarray(again)))],
        "empty": float(jax_timing.empty_step()()),
        "cast": [str(there.dtype), str(back.dtype)],
        "on_device": type(jax_timing.to_device(np.ones(2))).__name__,
    }))
    """
)


@pytest.fixture(scope="module")
def results():
    return run_jax_child(CHILD)


def test_the_timing_backend_on_jax_is_this_module(results):
    assert results["dispatch"] and results["versions"]


def test_a_mixed_layer_step_computes_in_bfloat16_with_float32_kernel_gradients(results):
    assert results["output_dtype"] == "bfloat16"
    assert results["kernel_gradient_dtype"] == "float32"
    assert results["input_gradient_shape"] == [2, 8]


def test_a_layer_steps_updated_state_is_returned(results):
    assert results["moving_statistics_updated"] == 2  # BatchNormalization's moving mean, var


def test_draws_casts_and_dispatch(results):
    assert results["draw"] == ["float16", True]
    assert results["empty"] == 2.0
    assert results["cast"] == ["bfloat16", "float32"]
    assert results["on_device"] == "ArrayImpl"
