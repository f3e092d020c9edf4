"""What the one-liner costs a `fit`: epoch wall times with and without `AutoPrecision()`.

A fresh copy of each model (same initial weights, same data, same batches) is
trained for `--epochs` epochs twice in this process: without a callback and with
`autoprec.AutoPrecision()` at its defaults (`hardware="local"`). The end of each
epoch is timed from the start of `fit`, so the first epoch includes tracing in both
runs. The two fits alternate `--rounds` times (the plain fit first in odd rounds,
second in even ones); the table gives the minimum and the median of each, the ratio
of the one-liner's first epoch and whole fit to the plain fit's, the median of the
epochs after the first (each fit's own), the plan kept and how long deciding took
(`plan.metadata["measured"]`); each round's seconds per epoch are printed above it.

```bash
python bench/oneliner_first_epoch.py --models all --epochs 3 --rounds 1
python bench/oneliner_first_epoch.py --models all --epochs 3 --fast-bfloat16
python bench/oneliner_first_epoch.py --models resnet50,encoder --decision-seconds 60
```

`--rerun` times, in fresh processes each round, a plain fit, the one-liner's first fit and its
rerun (the same script run again: it recalls the plan the first fit ended with, nothing
profiled or timed; `AutoPlan(remember=True)`, a memory folder of its own per round);
without it the one-liner decides afresh in every fit (`AutoPlan(remember=False)`).

```bash
python bench/oneliner_first_epoch.py --models transformer --epochs 2 --steps 150 --rerun --rounds 5
```

`--models all` runs nine models from 4 to 400 layers (DenseNet121; MobileNetV2 has 151).
`--fast-bfloat16` tells the one-liner that bfloat16 runs matmuls at twice float32's rate here
(a host `detect()` rates at 1x predicts too small a gain to race), so that it profiles,
times costs within its decision budget and races its candidates on this CPU (what it
measures is real; only what it is told pays is forced).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from common import host, models  # noqa: E402
from common.report import markdown_table  # noqa: E402

import autoprec  # noqa: E402


def _images(samples: int, size: int = 64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, size, size, 3)).astype("float32")
    return x, rng.integers(0, 10, samples)


def _tokens(samples: int, length: int = 64, per_token: bool = False):
    rng = np.random.default_rng(0)
    x = rng.integers(1, 1000, (samples, length)).astype("int32")
    return x, (np.roll(x, -1, axis=1) if per_token else rng.integers(0, 10, samples))


def _features(samples: int):
    rng = np.random.default_rng(0)
    return rng.normal(size=(samples, 784)).astype("float32"), rng.integers(0, 10, samples)


def _application(name: str):
    return lambda: getattr(keras.applications, name)(
        input_shape=(64, 64, 3), weights=None, classes=10
    )


#: Models by name: a builder of an uncompiled model, and its data (`samples -> (x, y)`).
MODELS = {
    "mobilenetv2": (_application("MobileNetV2"), _images),
    "resnet50": (_application("ResNet50"), _images),
    "densenet121": (_application("DenseNet121"), _images),
    "resnet_small": (lambda: models.resnet(32), lambda n: _images(n, 32)),
    "mlp": (lambda: models.mlp(784, 1024, 3), _features),
    "gru": (lambda: models.gru_classifier(64, units=256), _tokens),
    "encoder": (
        lambda: models.encoder_classifier(length=64, width=256, heads=4, blocks=4, hidden=1024),
        _tokens,
    ),
    "transformer": (
        lambda: models.encoder_classifier(length=128, width=256, heads=4, blocks=2, hidden=1024),
        lambda n: _tokens(n, length=128),
    ),
    "decoder": (
        lambda: models.decoder_lm(
            length=64, vocabulary=1000, width=256, heads=4, blocks=4, hidden=1024
        ),
        lambda n: _tokens(n, per_token=True),
    ),
}


def fast_bfloat16_here():
    """This device as `detect()` sees it, told that bfloat16 runs matmuls at twice float32's rate
    (or faster, if it says so): the one-liner then predicts a gain worth racing, profiles, times
    costs and races its candidates here (what it measures is real)."""
    device = autoprec.hardware.detect()
    doubled = 2 * (device.float32_flops or 1e11)
    return dataclasses.replace(
        device,
        fast_dtypes=("bfloat16",),
        slow_dtypes=("float16",),
        bfloat16_flops=max(device.bfloat16_flops or 0.0, doubled),
    )


class EpochEnds(keras.callbacks.Callback):
    """Records the seconds from the start of `fit` to the end of each epoch."""

    def on_train_begin(self, logs=None):
        self.started = time.perf_counter()
        self.ends: list[float] = []

    def on_epoch_end(self, epoch, logs=None):
        self.ends.append(time.perf_counter() - self.started)


def timed_fit(
    name: str,
    weights: list,
    data,
    epochs: int,
    one_liner: bool,
    hardware="local",
    decision_seconds: float | None = None,
    remember: bool = False,
):
    """Returns the epoch ends of one fit of a fresh copy, and the one-liner's plan."""
    model = MODELS[name][0]()
    model.set_weights(weights)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=name == "decoder"))
    timer = EpochEnds()
    callbacks = [timer]
    callback = None
    if one_liner:
        auto = autoprec.AutoPlan(decision_seconds=decision_seconds, remember=remember)
        callback = autoprec.AutoPrecision(hardware=hardware, auto=auto, verbose=0)
        callbacks.append(callback)
    x, y = data
    model.fit(x, y, batch_size=32, epochs=epochs, verbose=0, callbacks=callbacks)
    return timer.ends, (callback.plan if callback is not None else None)


def _epoch_seconds(ends: list[float]) -> str:
    """Each epoch's own seconds, from the ends `EpochEnds` recorded."""
    return " ".join(f"{end - start:.2f}" for start, end in zip([0.0, *ends], ends))


def _dtype_counts(plan) -> str:
    """How many layers the plan gives each dtype ("155 float32")."""
    counts = collections.Counter(plan.resolve().values())
    return ", ".join(f"{count} {dtype}" for dtype, count in counts.items() if count)


def measure(
    name: str,
    epochs: int,
    rounds: int,
    steps: int,
    hardware="local",
    decision_seconds: float | None = None,
) -> list:
    """Returns one table row for `name`: first epoch and whole fit, with and without."""
    keras.utils.set_random_seed(0)
    build, make_data = MODELS[name]
    weights = build().get_weights()
    data = make_data(32 * steps)
    plain, auto, plan = [], [], None
    for index in range(1, rounds + 1):
        # The order alternates: a fit that always ran second would meet a warmer process.
        for one_liner in (False, True) if index % 2 else (True, False):
            ends, kept = timed_fit(
                name, weights, data, epochs, one_liner, hardware, decision_seconds
            )
            if one_liner:
                auto.append(ends)
                plan = kept
            else:
                plain.append(ends)
        ends = auto[-1]
        decided = plan.metadata.get("measured") or {}
        raced = decided.get("median_ms") or {}
        print(
            f"  {name} round {index}, seconds per epoch: plain {_epoch_seconds(plain[-1])}"
            f" | one-liner {_epoch_seconds(ends)}; kept {_dtype_counts(plan)}"
            + ("; race medians " + ", ".join(f"{k} {v:.0f} ms" for k, v in raced.items()))
            * bool(raced)
            + (f"; {decided['why']}" if decided.get("why") else ""),
            flush=True,
        )
    first = [ends[0] for ends in auto], [ends[0] for ends in plain]
    whole = [ends[-1] for ends in auto], [ends[-1] for ends in plain]
    later = [ends[-1] - ends[0] for ends in auto], [ends[-1] - ends[0] for ends in plain]
    measured = dict(plan.metadata.get("measured") or {})
    return [
        name,
        f"{min(first[1]):.1f} / {statistics.median(first[1]):.1f}",
        f"{min(first[0]):.1f} / {statistics.median(first[0]):.1f}",
        f"{statistics.median(first[0]) / statistics.median(first[1]):.2f}x",
        f"{statistics.median(whole[1]):.1f}",
        f"{statistics.median(whole[0]):.1f}",
        f"{statistics.median(whole[0]) / statistics.median(whole[1]):.2f}x",
        f"{statistics.median(later[1]):.1f} / {statistics.median(later[0]):.1f}",
        _dtype_counts(plan),
        measured.get("decision_seconds", "-"),
        measured.get("candidates_timed", "-"),
    ]


#: The fits `--rerun` times in fresh processes each round, in this order.
RERUN_FITS = ("plain", "first", "rerun")


def fresh_fit(name: str, fit: str, args: argparse.Namespace, memory: str) -> dict:
    """Runs one fit (`RERUN_FITS`) of `name` in a fresh process; returns its epoch ends and plan."""
    command = [sys.executable, __file__, "--child", fit, "--models", name]
    command += ["--epochs", str(args.epochs), "--steps", str(args.steps)]
    command += ["--fast-bfloat16"] * args.fast_bfloat16
    if args.decision_seconds is not None:
        command += ["--decision-seconds", str(args.decision_seconds)]
    # The child imports the autoprec this process imported.
    package_root = str(Path(autoprec.__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    environment = dict(os.environ, AUTOPREC_CACHE_DIR=memory, PYTHONPATH=path)
    result = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    if result.returncode:
        raise SystemExit(f"{name} {fit} fit failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def child(name: str, fit: str, args: argparse.Namespace, hardware) -> None:
    """Runs one fit in this (fresh) process and prints its epoch ends and plan as one JSON line."""
    keras.utils.set_random_seed(0)
    build, make_data = MODELS[name]
    ends, plan = timed_fit(
        name,
        build().get_weights(),
        make_data(32 * args.steps),
        args.epochs,
        fit != "plain",
        hardware,
        args.decision_seconds,
        remember=True,
    )
    measured = (plan.metadata.get("measured") or {}) if plan is not None else {}
    kept = _dtype_counts(plan) if plan is not None else "-"
    print(json.dumps({"ends": ends, "kept": kept, "measured": measured}, default=str))


def measure_rerun(name: str, args: argparse.Namespace) -> list:
    """Returns one table row for `name`: a plain fit, the one-liner's first fit and its rerun."""
    fits: dict[str, list[dict]] = {fit: [] for fit in RERUN_FITS}
    for index in range(1, args.rounds + 1):
        with tempfile.TemporaryDirectory() as memory:
            for fit in RERUN_FITS:
                fits[fit].append(fresh_fit(name, fit, args, memory))
        rerun = fits["rerun"][-1]
        print(
            f"  {name} round {index}, seconds per epoch: "
            + " | ".join(f"{fit} {_epoch_seconds(fits[fit][-1]['ends'])}" for fit in RERUN_FITS)
            + f"; kept {fits['first'][-1]['kept']}, rerun "
            + f"{rerun['kept']}, recalled {rerun['measured'].get('recalled')}",
            flush=True,
        )
    first = {fit: [run["ends"][0] for run in runs] for fit, runs in fits.items()}
    whole = {fit: [run["ends"][-1] for run in runs] for fit, runs in fits.items()}
    measured = fits["first"][-1]["measured"]
    raced = measured.get("median_ms") or {}
    speedup = raced["float32"] / raced[measured["winner"]] if measured.get("winner") else 1.0
    return [
        name,
        *(f"{min(first[fit]):.1f} / {statistics.median(first[fit]):.1f}" for fit in RERUN_FITS),
        *(f"{min(whole[fit]):.1f} / {statistics.median(whole[fit]):.1f}" for fit in RERUN_FITS),
        f"{statistics.median(whole['first']) / statistics.median(whole['plain']):.2f}x",
        f"{statistics.median(first['rerun']) / statistics.median(first['plain']):.2f}x",
        f"{1.05 / speedup:.2f}x",
        fits["first"][-1]["kept"],
        measured.get("decision_seconds", "-"),
    ]


RERUN_HEADER = [
    "model",
    *(f"first epoch s, {fit} (min / median)" for fit in RERUN_FITS),
    *(f"fit s, {fit} (min / median)" for fit in RERUN_FITS),
    "first fit / plain",
    "rerun first epoch / plain",
    "goal: 1.05 / race speedup",
    "plan kept",
    "deciding s",
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mobilenetv2")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30, help="steps an epoch")
    parser.add_argument(
        "--fast-bfloat16",
        action="store_true",
        help="tell the one-liner bfloat16 runs fast here: it then profiles, times and races",
    )
    parser.add_argument(
        "--decision-seconds",
        type=float,
        help="AutoPlan(decision_seconds=...): the decision's budget (default its own)",
    )
    parser.add_argument(
        "--rerun",
        action="store_true",
        help="each round in fresh processes: a plain fit, the one-liner's first fit, its rerun",
    )
    parser.add_argument("--child", choices=RERUN_FITS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    hardware = fast_bfloat16_here() if args.fast_bfloat16 else "local"
    if args.child:
        child(args.models, args.child, args, hardware)
        return
    print(
        f"host: {host.cpu_model()}, {host.cores()} cores, 16-bit flags: "
        f"{', '.join(host.sixteen_bit_flags()) or 'none'}; load {host.load():.1f}"
    )
    names = list(MODELS) if args.models == "all" else args.models.split(",")
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        parser.error(
            f"--models: unknown model(s) {', '.join(unknown)}; choose from "
            f"{', '.join(MODELS)} (comma-separated) or all"
        )
    rows = []
    for name in names:
        if args.rerun:
            rows.append(measure_rerun(name, args))
        else:
            rows.append(
                measure(name, args.epochs, args.rounds, args.steps, hardware, args.decision_seconds)
            )
        print(" | ".join(str(cell) for cell in rows[-1]), flush=True)
    if args.rerun:
        print(markdown_table(RERUN_HEADER, rows))
        return
    header = [
        "model",
        "first epoch s, plain (min / median)",
        "first epoch s, one-liner",
        "first epoch ratio",
        f"{args.epochs} epochs s, plain",
        f"{args.epochs} epochs s, one-liner",
        "fit ratio",
        "later epochs s, plain / one-liner (median)",
        "plan kept",
        "deciding s",
        "candidates timed",
    ]
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
