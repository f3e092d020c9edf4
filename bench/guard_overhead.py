"""Train-step time with the runtime guard on versus off, side by side.

For each model (a small ResNet-style CNN and a small Transformer encoder) three
copies with identical weights run the same plan (bfloat16 with a float32 head)
through `autoprec.AutoPrecision`: "guard off" (`guard=None`), "skip only"
(`guard=None`, the optimizer wrapped as the guard wraps it for a bfloat16
plan: an `autoprec.FlooredLossScaleOptimizer` fixed at scale 1, which skips
non-finite steps) and "guard on" (`guard=autoprec.Guard()`: that same wrapper, plus
the copy of a skipped step's batch inside the compiled step and one read of the
skipped-step count per step; no per-layer work: a skipped step is replayed with
amax probes). "on/off" is the whole guard's cost, "on/skip only" the keeping's. Each copy first trains `--steps` steps untimed (the
warm-up, which also traces), then both are timed in `--rounds` interleaved
rounds of `--steps` steps whose order rotates. Each step is timed from
`on_train_batch_begin` to the end of the guard's own `on_train_batch_end`, and a
round's figure is the median of its steps (a one-off stall of the shared host
moves a mean, not a median; the guard's per-step work is the same every step).
The table gives the minimum and the median over rounds, and the ratios of each;
the goal is at most 1.03x. The same ratios from round means are in the JSON
(`mean_ratio_min`, `mean_ratio_median`), and the median of each round's own on/off ratio
(`paired_ratio_median`: a drift of the host between rounds cancels in it). Differences under ~5 % are within this
machine's noise.

The last line printed is the same figures as JSON.

Run:

    python bench/guard_overhead.py [--rounds 7] [--steps 8] [--batch-size 32] [--smoke]
"""

from __future__ import annotations

import argparse
import json
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/, for its shared `common`
from common.fitting import dataset_for, fit_step_seconds  # noqa: E402
from common.host import cpu_model  # noqa: E402
from common.timing import MIN_ROUNDS, spread, time_rounds  # noqa: E402
from profiler_overhead import build_resnet, build_transformer  # noqa: E402

ARMS = ("guard off", "skip only", "guard on")


def guarded_pair(builder, jit_compile: bool) -> dict[str, tuple[keras.Model, keras.Model]]:
    """Three compiled copies of one model, same weights, each with its `AutoPrecision`."""
    models = [builder() for _ in ARMS]
    for model in models[1:]:
        model.set_weights(models[0].get_weights())
    arms = {}
    for name, model in zip(ARMS, models):
        optimizer = keras.optimizers.SGD(0.01)
        if name == "skip only":  # what the guard wraps a bfloat16 plan's optimizer in
            optimizer = autoprec.runtime.FlooredLossScaleOptimizer(
                optimizer, initial_scale=1.0, floor=None, fixed=True
            )
            optimizer.scales_loss = False  # scale 1: as the guard's wrapper, nothing to unscale
        model.compile(
            optimizer=optimizer,
            loss="sparse_categorical_crossentropy",
            jit_compile=jit_compile,
        )
        plan = autoprec.PrecisionPlan.uniform(model, "bfloat16").with_dtype("head", "float32")
        guard = autoprec.Guard() if name == "guard on" else None
        callback = autoprec.AutoPrecision(plan, guard=guard, verbose=0)
        arms[name] = (model, callback)
    return arms


def step_seconds(model, callback, data, steps: int) -> list[float]:
    """Seconds of each of `steps` train steps in one `fit`, the timer after the guard."""
    return fit_step_seconds(model, data, steps, [callback])


def measure(builder, batch_size: int, rounds: int, steps: int, jit_compile: bool) -> dict:
    """Interleaved, rotating rounds of every arm; minimum and median of each, and their ratios."""
    keras.utils.set_random_seed(0)
    arms = guarded_pair(builder, jit_compile)
    data = dataset_for(arms[ARMS[0]][0], batch_size)
    # Each arm's warm-up is a round of as many steps as a timed one.
    samples = time_rounds(
        {name: lambda arm=arms[name]: step_seconds(*arm, data, steps) for name in ARMS},
        rounds,
    )
    off, skip, on = (spread([statistics.median(s) for s in samples[name]]) for name in ARMS)
    mean_off, mean_on = (spread([statistics.fmean(s) for s in samples[n]]) for n in ARMS[::2])
    # Each round's on/off ratio: a drift of the shared host between rounds cancels.
    paired = [
        statistics.median(on_steps) / statistics.median(off_steps)
        for on_steps, off_steps in zip(samples["guard on"], samples["guard off"])
    ]
    guarded_model = arms["guard on"][0]
    return {
        "off_ms_min": off["min"] * 1e3,
        "off_ms_median": off["median"] * 1e3,
        "skip_ms_min": skip["min"] * 1e3,
        "skip_ms_median": skip["median"] * 1e3,
        "on_ms_min": on["min"] * 1e3,
        "on_ms_median": on["median"] * 1e3,
        "ratio_min": on["min"] / off["min"],
        "ratio_median": on["median"] / off["median"],
        "telemetry_ratio_min": on["min"] / skip["min"],
        "telemetry_ratio_median": on["median"] / skip["median"],
        "mean_ratio_min": mean_on["min"] / mean_off["min"],
        "mean_ratio_median": mean_on["median"] / mean_off["median"],
        "paired_ratio_median": statistics.median(paired),
        "weights_finite": all(np.isfinite(w).all() for w in guarded_model.get_weights()),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (at least 5)")
    parser.add_argument("--steps", type=int, default=8, help="steps per round and of warm-up")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--jit-compile", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="smallest sizes, for the tests")
    args = parser.parse_args(argv)
    rounds, steps, batch_size = max(args.rounds, MIN_ROUNDS), args.steps, args.batch_size
    builders = {"resnet-cnn": build_resnet, "transformer": build_transformer}
    if args.smoke:
        rounds, steps, batch_size = MIN_ROUNDS, 2, 4
        builders["transformer"] = lambda: build_transformer(length=16, width=32)
    started = time.time()
    host = cpu_model()
    results = {
        name: measure(builder, batch_size, rounds, steps, args.jit_compile)
        for name, builder in builders.items()
    }
    print(
        f"host: {host} ({os.cpu_count()} CPU cores), TF {tf.__version__}, plan bfloat16 + "
        f"float32 head, batch {batch_size}, warm-up {steps} steps, {rounds} interleaved rounds "
        f"x {steps} steps, jit_compile={args.jit_compile}"
    )
    header = (
        f"{'model':<12} {'ms/step min / median':>20} {'':>13} {'':>13}   "
        f"{'on/off':>15}   {'on/skip only':>15}"
    )
    print(header)
    print(
        f"{'':<12} {'guard off':>13} {'skip only':>13} {'guard on':>13}   "
        f"{'min':>7} {'median':>7}   {'min':>7} {'median':>7}"
    )
    print("-" * 93)
    for name, row in results.items():
        print(
            f"{name:<12} {row['off_ms_min']:>6.1f}/{row['off_ms_median']:<6.1f} "
            f"{row['skip_ms_min']:>6.1f}/{row['skip_ms_median']:<6.1f} "
            f"{row['on_ms_min']:>6.1f}/{row['on_ms_median']:<6.1f}   "
            f"{row['ratio_min']:>6.3f}x {row['ratio_median']:>6.3f}x   "
            f"{row['telemetry_ratio_min']:>6.3f}x {row['telemetry_ratio_median']:>6.3f}x"
        )
    for name, row in results.items():
        print(
            f"{name}: on/off from round means (min / median): {row['mean_ratio_min']:.3f}x / "
            f"{row['mean_ratio_median']:.3f}x; median of each round's on/off: "
            f"{row['paired_ratio_median']:.3f}x"
        )
    print(f"({time.time() - started:.0f} s; goal: at most 1.03x; under ~5 % is noise)")
    report = {
        "host": host,
        "rounds": rounds,
        "steps": steps,
        "batch_size": batch_size,
        "models": results,
    }
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
