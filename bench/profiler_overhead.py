"""Train-step overhead of autoprec's profiler probes, of nothing once they are removed, and of the guard.

For each model (a ResNet-style CNN and a small Transformer encoder) two
identical copies are trained side by side in one process: the baseline never
sees a probe, the other is probed (exact exponent histograms: what a
profiling window costs), then has its probes removed. Timed steps alternate
between the two copies (interleaved repeats), so machine noise hits both
alike; the table shows median step times and their ratio.

The "guard telemetry" row is the always-on cost: both copies run a bfloat16
plan (float32 head) through `autoprec.AutoPrecision`, the baseline with
`guard=False`, the other with `guard=True` (per-layer amax telemetry in every
step; `bench/guard_overhead.py` measures it in more detail).

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
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import autoprec  # noqa: E402
from autoprec.profiler import ProbeSession  # noqa: E402


def residual_block(inputs, filters: int, stride: int, name: str):
    """Conv-BN-ReLU-Conv-BN plus a (projected) shortcut, then ReLU."""
    layers = keras.layers
    hidden = layers.Conv2D(filters, 3, strides=stride, padding="same", name=f"{name}_conv1")(inputs)
    hidden = layers.BatchNormalization(name=f"{name}_bn1")(hidden)
    hidden = layers.Activation("relu", name=f"{name}_relu1")(hidden)
    hidden = layers.Conv2D(filters, 3, padding="same", name=f"{name}_conv2")(hidden)
    hidden = layers.BatchNormalization(name=f"{name}_bn2")(hidden)
    shortcut = inputs
    if stride != 1 or inputs.shape[-1] != filters:
        shortcut = layers.Conv2D(filters, 1, strides=stride, name=f"{name}_project")(inputs)
    hidden = layers.Add(name=f"{name}_add")([hidden, shortcut])
    return layers.Activation("relu", name=f"{name}_relu2")(hidden)


def build_resnet(classes: int = 10) -> keras.Model:
    """A small ResNet: stem, three residual stages (32, 64, 128 filters), pooling, softmax."""
    inputs = keras.Input((32, 32, 3))
    hidden = keras.layers.Conv2D(32, 3, padding="same", name="stem")(inputs)
    hidden = keras.layers.BatchNormalization(name="stem_bn")(hidden)
    hidden = keras.layers.Activation("relu", name="stem_relu")(hidden)
    for index, (filters, stride) in enumerate([(32, 1), (64, 2), (128, 2)]):
        hidden = residual_block(hidden, filters, stride, name=f"stage{index}")
    hidden = keras.layers.GlobalAveragePooling2D()(hidden)
    outputs = keras.layers.Dense(classes, activation="softmax", name="head")(hidden)
    return keras.Model(inputs, outputs, name="resnet")


def encoder_block(inputs, heads: int, width: int, name: str):
    """Post-norm Transformer encoder block: attention and a ReLU feed-forward."""
    layers = keras.layers
    attended = layers.MultiHeadAttention(heads, width // heads, name=f"{name}_attention")(
        inputs, inputs
    )
    hidden = layers.LayerNormalization(name=f"{name}_norm1")(
        layers.Add(name=f"{name}_add1")([inputs, attended])
    )
    feed = layers.Dense(width * 2, activation="relu", name=f"{name}_ff1")(hidden)
    feed = layers.Dense(width, name=f"{name}_ff2")(feed)
    return layers.LayerNormalization(name=f"{name}_norm2")(
        layers.Add(name=f"{name}_add2")([hidden, feed])
    )


def build_transformer(classes: int = 10, length: int = 64, width: int = 128) -> keras.Model:
    """A two-block Transformer encoder classifier over `length` tokens."""
    inputs = keras.Input((length,), dtype="int32")
    hidden = keras.layers.Embedding(1000, width, name="embedding")(inputs)
    for index in range(2):
        hidden = encoder_block(hidden, heads=4, width=width, name=f"block{index}")
    hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    outputs = keras.layers.Dense(classes, activation="softmax", name="head")(hidden)
    return keras.Model(inputs, outputs, name="transformer")


def dataset_for(model: keras.Model, batch_size: int) -> tf.data.Dataset:
    """An endless in-memory dataset of random batches matching the model's input."""
    rng = np.random.default_rng(0)
    shape = (batch_size * 4, *model.input_shape[1:])
    if model.input.dtype == "int32":
        x = rng.integers(0, 1000, size=shape).astype("int32")
    else:
        x = rng.normal(size=shape).astype("float32")
    y = rng.integers(0, 10, size=(shape[0],)).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).repeat().cache()


class StepTimer(keras.callbacks.Callback):
    """Records the wall time of every train step (synchronised by reading the loss)."""

    def __init__(self):
        super().__init__()
        self.seconds: list[float] = []
        self.started = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        float(logs["loss"])
        self.seconds.append(time.perf_counter() - self.started)


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


def timed_steps(
    model: keras.Model, data: tf.data.Dataset, steps: int, callbacks: list | None = None
) -> list[float]:
    timer = StepTimer()
    callbacks = [*(callbacks or []), timer]  # the timer last: the guard's read counts
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=callbacks)
    return timer.seconds


def interleaved_medians(
    baseline: keras.Model,
    other: keras.Model,
    data,
    repeats: int,
    steps: int,
    callbacks: tuple[list, list] = ([], []),
) -> tuple[float, float]:
    """Median step seconds of both models, alternating `repeats` runs of `steps` steps."""
    timed_steps(baseline, data, 2, callbacks[0])  # trace, compile, warm caches
    timed_steps(other, data, 2, callbacks[1])
    baseline_times, other_times = [], []
    for _ in range(repeats):
        baseline_times += timed_steps(baseline, data, steps, callbacks[0])
        other_times += timed_steps(other, data, steps, callbacks[1])
    return statistics.median(baseline_times), statistics.median(other_times)


def guard_callbacks(baseline: keras.Model, guarded: keras.Model) -> tuple[list, list]:
    """A bfloat16 plan (float32 head) on both copies: the guard off on one, on on the other."""
    callbacks = []
    for model, guard in ((baseline, False), (guarded, True)):
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
        (name, "guard telemetry", None, None, guard_off_ms, guard_on_ms, None),
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
        "probed: exact histograms while profiling (baseline: no probes); guard telemetry: "
        "always-on amax telemetry (baseline: the same bfloat16 plan, guard=False)"
    )


if __name__ == "__main__":
    main()
