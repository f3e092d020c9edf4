"""What the one-liner costs a `fit`: epoch wall times with and without `AutoPrecision()`.

A fresh copy of each model (same initial weights, same data, same batches) is
trained for `--epochs` epochs twice in this process: without a callback and with
`autoprec.AutoPrecision()` at its defaults (`hardware="local"`). The end of each
epoch is timed from the start of `fit`, so the first epoch includes tracing in both
runs. The two fits alternate `--rounds` times; the table gives the minimum and the
median of each, the ratio of the one-liner's first epoch and whole fit to the plain
fit's, the plan kept and how long deciding took (`plan.metadata["measured"]`).

```bash
python bench/oneliner_first_epoch.py --models mobilenetv2 --epochs 3 --rounds 1
```
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from common import host  # noqa: E402
from common.report import markdown_table  # noqa: E402

import autoprec  # noqa: E402

#: Models by name: a builder of an uncompiled model and its input shape.
MODELS = {
    "mobilenetv2": lambda: keras.applications.MobileNetV2(
        input_shape=(64, 64, 3), weights=None, classes=10
    ),
    "resnet50": lambda: keras.applications.ResNet50(
        input_shape=(64, 64, 3), weights=None, classes=10
    ),
    "densenet121": lambda: keras.applications.DenseNet121(
        input_shape=(64, 64, 3), weights=None, classes=10
    ),
}


class EpochEnds(keras.callbacks.Callback):
    """Records the seconds from the start of `fit` to the end of each epoch."""

    def on_train_begin(self, logs=None):
        self.started = time.perf_counter()
        self.ends: list[float] = []

    def on_epoch_end(self, epoch, logs=None):
        self.ends.append(time.perf_counter() - self.started)


def timed_fit(name: str, weights: list, data, epochs: int, one_liner: bool):
    """Returns the epoch ends of one fit of a fresh copy, and the one-liner's plan."""
    model = MODELS[name]()
    model.set_weights(weights)
    model.compile("adam", "sparse_categorical_crossentropy")
    timer = EpochEnds()
    callbacks = [timer]
    callback = None
    if one_liner:
        callback = autoprec.AutoPrecision(verbose=0)
        callbacks.append(callback)
    x, y = data
    model.fit(x, y, batch_size=32, epochs=epochs, verbose=0, callbacks=callbacks)
    return timer.ends, (callback.plan if callback is not None else None)


def measure(name: str, epochs: int, rounds: int, steps: int) -> list:
    """Returns one table row for `name`: first epoch and whole fit, with and without."""
    keras.utils.set_random_seed(0)
    weights = MODELS[name]().get_weights()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32 * steps, 64, 64, 3)).astype("float32")
    data = (x, rng.integers(0, 10, len(x)))
    plain, auto, plan = [], [], None
    for _ in range(rounds):
        plain.append(timed_fit(name, weights, data, epochs, one_liner=False)[0])
        ends, plan = timed_fit(name, weights, data, epochs, one_liner=True)
        auto.append(ends)
    first = [ends[0] for ends in auto], [ends[0] for ends in plain]
    whole = [ends[-1] for ends in auto], [ends[-1] for ends in plain]
    measured = dict(plan.metadata.get("measured") or {})
    counts = collections.Counter(plan.resolve().values())
    return [
        name,
        f"{min(first[1]):.1f} / {statistics.median(first[1]):.1f}",
        f"{min(first[0]):.1f} / {statistics.median(first[0]):.1f}",
        f"{statistics.median(first[0]) / statistics.median(first[1]):.2f}x",
        f"{statistics.median(whole[1]):.1f}",
        f"{statistics.median(whole[0]):.1f}",
        f"{statistics.median(whole[0]) / statistics.median(whole[1]):.2f}x",
        ", ".join(f"{count} {dtype}" for dtype, count in counts.items() if count),
        measured.get("decision_seconds", "-"),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mobilenetv2")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30, help="steps an epoch")
    args = parser.parse_args(argv)
    print(
        f"host: {host.cpu_model()}, {host.cores()} cores, 16-bit flags: "
        f"{', '.join(host.sixteen_bit_flags()) or 'none'}; load {host.load():.1f}"
    )
    rows = [measure(name, args.epochs, args.rounds, args.steps) for name in args.models.split(",")]
    header = [
        "model",
        "first epoch s, plain (min / median)",
        "first epoch s, one-liner",
        "first epoch ratio",
        f"{args.epochs} epochs s, plain",
        f"{args.epochs} epochs s, one-liner",
        "fit ratio",
        "plan kept",
        "deciding s",
    ]
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
