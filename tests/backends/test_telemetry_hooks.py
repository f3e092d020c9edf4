"""What both backends' telemetry hooks share (autoprec/_backends/instrument.py) and TensorFlow's wrappers.

`advance_history` runs with the real guard telemetry as its recorder, once on
the host (NumPy, as on JAX) and once with `keras.ops` inside a `tf.function`
(as on TensorFlow), on the same frames; `step_wrappers` is checked through
TensorFlow's hooks on a real model.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from autoprec import PrecisionPlan
from autoprec._backends.instrument import STATUS_SLOTS, advance_history, cleared_status
from autoprec.runtime import apply_plan
from autoprec.runtime.telemetry import GuardTelemetry


@pytest.fixture
def telemetry() -> GuardTelemetry:
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, name="wide"), keras.layers.Dense(1, name="out")]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    handle = apply_plan(model, PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32"))
    return GuardTelemetry(model, handle.dtypes, history_steps=3)


def _frames() -> list[np.ndarray]:
    """Three frames `[rows, slots]`: finite, one with a NaN (a failed step), finite again."""
    finite = np.array([[1.0, 1.0, 0.0, -1.0], [2.0, 1.0, -1.0, 0.5]], np.float32)
    failed = finite.copy()
    failed[1, 0] = np.nan
    return [finite, failed, finite * 2.0]


def _on_the_host(recorder, history, frames) -> list[tuple[np.ndarray, np.ndarray]]:
    states, status = [], cleared_status()
    for frame in frames:
        history, status = advance_history(recorder, frame, history, status, np)
        states.append((history, status))
    return states


def _in_graph(recorder, history, frames) -> list[tuple[np.ndarray, np.ndarray]]:
    @tf.function
    def step(frame, history, status):
        history, status = advance_history(recorder, frame, history, status, ops)
        return history, ops.cast(status, "int32")

    states, status = [], tf.constant(cleared_status())
    history = tf.constant(history)
    for frame in frames:
        history, status = step(tf.constant(frame), history, status)
        states.append((history.numpy(), status.numpy()))
    return states


def test_the_cleared_status_has_no_flag_raised():
    status = cleared_status()
    assert status.dtype == np.int32 and status.tolist() == [0] * STATUS_SLOTS == [0, 0]
    status[0] = 1
    assert cleared_status().tolist() == [0, 0]  # a fresh array each time


@pytest.mark.parametrize("advance", [_on_the_host, _in_graph], ids=["numpy", "keras_ops"])
def test_a_frame_is_appended_and_a_raised_flag_stays_raised(telemetry, advance):
    history = telemetry.hooks.read_history()
    assert history.shape == (3, 2, 4) and np.all(history == -1.0)
    frames = _frames()
    states = advance(telemetry, history, frames)
    (first, first_status), (second, second_status), (third, third_status) = states
    np.testing.assert_array_equal(first[:-1], history[1:])  # the oldest frame dropped
    np.testing.assert_array_equal(first[-1], frames[0])
    np.testing.assert_array_equal(second[-2:], np.stack(frames[:2]))
    np.testing.assert_array_equal(third, np.stack(frames))
    assert first_status.tolist() == [0, 0]
    assert second_status.tolist() == [1, 0]  # the NaN: a failed step
    assert third_status.tolist() == [1, 0]  # still raised: only a clear resets it
    assert second_status.dtype == np.int32


def test_a_rising_amax_near_float16s_largest_raises_near_range(telemetry):
    history = telemetry.hooks.read_history()
    frame = _frames()[0].copy()
    frame[1, 0] = telemetry.near_threshold * 1.5  # the float16 layer's output
    (_, status), (_, again) = _on_the_host(telemetry, history, [frame, frame])
    assert status.tolist() == [0, 1]
    assert again.tolist() == [0, 1]  # not rising any more, but not cleared either


def test_the_step_wrappers_are_the_train_step_and_apply_gradients(telemetry):
    model, hooks = telemetry.model, telemetry.hooks
    wrappers = hooks.step_wrappers(model, telemetry, {})
    assert [(owner, name) for owner, name, _ in wrappers] == [
        (model, "train_step"),
        (model.optimizer, "apply_gradients"),
    ]
    assert [value.__name__ for _, _, value in wrappers] == ["train_step", "apply_gradients"]
