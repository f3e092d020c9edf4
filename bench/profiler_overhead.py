"""Train-step overhead of autoprec's profiler probes, of nothing once they are removed, and of the guard.

For each model (a ResNet-style CNN and a small Transformer encoder) two
identical copies are trained side by side in one process: the baseline never
sees a probe, the other is probed (exact exponent histograms: what a
profiling window costs), then has its probes removed. Timed steps alternate
between the two copies (interleaved repeats), so machine noise hits both
alike; the table shows median step times and their ratio.

The "guard" row is the guard's always-on cost: both copies run a bfloat16
plan (float32 head) through `autoprec.AutoPrecision`, the baseline with
`guard=None`, the other with `guard=autoprec.Guard()` (no per-layer work in a
step: the loss-scaling optimizer skips a non-finite step, the step keeps that
step's batch, and only a skipped step is replayed through amax probes;
`bench/guard_overhead.py` measures it in more detail).

The last column is a floor: the time an exact exponent count alone
(TensorFlow's `DenseBincount`, the cheapest exact counting kernel on CPU)
takes for the number of values the probes see per step, measured in the same
run, added to the baseline. No exact profiler built from TensorFlow kernels
can go below it on this machine.

Run:

    python bench/profiler_overhead.py [--repeats 5] [--steps 8] [--jit-compile]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import autoprec  # noqa: E402
from autoprec.profiler import ProbeSession  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/, for its shared `common`
from common.fitting import dataset_for, fit_step_seconds  # noqa: E402
from common.models import encoder_classifier, resnet  # noqa: E402
from common.timing import time_rounds  # noqa: E402

#: The small ResNet-style CNN (stem, stages of 32, 64 and 128 filters) on 32x32 images.
build_resnet = resnet


def build_transformer(length: int = 64, width: int = 128) -> keras.Model:
    """A two-block Transformer encoder classifier over `length` tokens (ReLU feed-forward)."""
    return encoder_classifier(
        length=length, width=width, heads=4, blocks=2, hidden=2 * width, activation="relu"
    )


def twin_models(builder, jit_compile: bool) -> tuple[keras.Model, keras.Model]:
    """Two compiled copies of one architecture with identical weights."""
    first = builder()
    second = builder()
    second.set_weights(first.get_weights())
    for model in (first, second):
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss="sparse_categorical_crossentropy",
            jit_compile=jit_compile,
        )
    return first, second


def interleaved_medians(
    baseline: keras.Model,
    other: keras.Model,
    data,
    repeats: int,
    steps: int,
    callbacks: tuple[list, list] = ([], []),
) -> tuple[float, float]:
    """Median step seconds of both models over `repeats` interleaved rounds of `steps` steps.

    A warm-up round of each first (it traces and compiles); the rounds alternate which
    model goes first.
    """
    runs = {
        "baseline": lambda: fit_step_seconds(baseline, data, steps, callbacks[0]),
        "other": lambda: fit_step_seconds(other, data, steps, callbacks[1]),
    }
    rounds = time_rounds(runs, repeats)
    return tuple(
        statistics.median(seconds for steps_seconds in rounds[name] for seconds in steps_seconds)
        for name in runs
    )


def guard_callbacks(baseline: keras.Model, guarded: keras.Model) -> tuple[list, list]:
    """A bfloat16 plan (float32 head) on both copies: the guard off on one, on on the other."""
    callbacks = []
    for model, guard in ((baseline, None), (guarded, autoprec.Guard())):
        plan = autoprec.PrecisionPlan.uniform(model, "bfloat16").with_dtype("head", "float32")
        callbacks.append([autoprec.AutoPrecision(plan, guard=guard, verbose=0)])
    return callbacks[0], callbacks[1]


def counting_seconds_per_value(values: int = 1 << 20, repeats: int = 20) -> float:
    """Median seconds per value of an exact exponent count (`DenseBincount`) on this machine."""
    data = tf.constant(np.random.default_rng(0).normal(size=values).astype("float32"))
    no_weights = tf.zeros([0], tf.int32)

    @tf.function
    def count(tensor):
        # The profiler's own exponent count outside XLA: DenseBincount called directly
        # (tf.math.bincount adds a reduce_max pass to size its output).
        exponents = tf.bitwise.right_shift(tf.bitcast(tf.abs(tensor), tf.int32), 23)
        return tf.raw_ops.DenseBincount(
            input=exponents, size=256, weights=no_weights, binary_output=False
        )

    @tf.function
    def touch(tensor):
        return tf.abs(tensor)[:256]

    def median_seconds(function) -> float:
        function(data).numpy()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            function(data).numpy()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    return max(median_seconds(count) - median_seconds(touch), 0.0) / values


def values_per_step(session: ProbeSession) -> float:
    """Values the probes measured per train step (element counts summed over every statistic)."""
    return session.values_recorded() / max(session.steps_recorded(), 1)


def measure(name: str, builder, batch_size: int, repeats: int, steps: int, jit: bool) -> list:
    keras.utils.set_random_seed(0)
    baseline, probed = twin_models(builder, jit)
    data = dataset_for(baseline, batch_size)
    with ProbeSession(probed) as session:
        base_ms, probed_ms = interleaved_medians(baseline, probed, data, repeats, steps)
        probes = session.probed_tensor_count
        values = values_per_step(session)
    floor_ms = base_ms + values * counting_seconds_per_value()
    base_after_ms, removed_ms = interleaved_medians(baseline, probed, data, repeats, steps)
    keras.utils.set_random_seed(0)
    unguarded, guarded = twin_models(builder, jit)
    guard_off_ms, guard_on_ms = interleaved_medians(
        unguarded, guarded, data, repeats, steps, guard_callbacks(unguarded, guarded)
    )
    return [
        (name, "probed", probes, values, base_ms, probed_ms, floor_ms),
        (name, "probes removed", 0, 0, base_after_ms, removed_ms, None),
        (name, "guard", None, None, guard_off_ms, guard_on_ms, None),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--jit-compile", action="store_true")
    arguments = parser.parse_args()
    rows = []
    for name, builder in (("resnet-cnn", build_resnet), ("transformer", build_transformer)):
        rows += measure(
            name,
            builder,
            arguments.batch_size,
            arguments.repeats,
            arguments.steps,
            arguments.jit_compile,
        )
    print(
        f"batch {arguments.batch_size}, {arguments.repeats} x {arguments.steps} interleaved "
        f"steps per model, jit_compile={arguments.jit_compile}, "
        f"{os.cpu_count()} CPU cores, TF {tf.__version__}"
    )
    header = (
        f"{'model':<12} {'state':<15} {'stat vars':>9} {'values/step':>11} {'baseline ms':>12} "
        f"{'this ms':>9} {'ratio':>6} {'count floor':>11}"
    )
    print(header)
    print("-" * len(header))
    for name, state, probes, values, base, other, floor in rows:
        floor_text = f"{floor / base:.2f}x" if floor else "-"
        probes_text = "-" if probes is None else str(probes)
        values_text = "-" if values is None else f"{values / 1e6:.1f}M"
        print(
            f"{name:<12} {state:<15} {probes_text:>9} {values_text:>11} {base * 1e3:>12.1f} "
            f"{other * 1e3:>9.1f} {other / base:>6.2f}x {floor_text:>11}"
        )
    print(
        "probed: exact histograms while profiling (baseline: no probes); guard: a skipped "
        "step's batch kept, replayed with amax probes (baseline: the same bfloat16 plan, "
        "guard=None)"
    )


if __name__ == "__main__":
    main()
