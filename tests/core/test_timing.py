"""The one interleaved timer (autoprec/_core/timing.py)."""

from __future__ import annotations

import time

import pytest

from autoprec._core.timing import Timing, time_interleaved


def test_every_function_is_timed_each_round_after_its_warm_up():
    calls = {"a": 0, "b": 0}

    def counter(name):
        def call():
            calls[name] += 1

        return call

    timings = time_interleaved({"a": counter("a"), "b": counter("b")}, rounds=5, warmup=2)
    assert calls == {"a": 7, "b": 7}
    assert [len(timing.samples) for timing in timings.values()] == [5, 5]


def test_rounds_rotate_the_order():
    order = []
    functions = {name: (lambda name=name: order.append(name)) for name in "abc"}
    time_interleaved(functions, rounds=3, warmup=1)
    assert order[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_a_slow_function_is_timed_apart_and_fewer_times():
    order = []

    def fast():
        order.append("fast")

    def slow():
        order.append("slow")
        time.sleep(0.02)

    timings = time_interleaved(
        {"slow": slow, "fast": fast}, rounds=4, warmup=1, slow_factor=10, slow_rounds=1
    )
    assert len(timings["fast"].samples) == 4
    assert len(timings["slow"].samples) == 1
    assert order[2:] == ["fast"] * 4 + ["slow"]
    assert timings["slow"].minimum > timings["fast"].median


def test_timing_statistics():
    timing = Timing((3.0, 1.0, 2.0))
    assert timing.median == 2.0
    assert timing.minimum == 1.0
    with pytest.raises(AttributeError):
        timing.samples = ()
