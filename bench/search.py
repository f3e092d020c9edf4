"""Benchmark of `autoprec.search`: wall time, plan cost against the uniform plans, budget held.

Models (generated data, `keras.applications` with `weights=None` on 64x64 inputs):
MobileNetV2, ResNet50, EfficientNetB0, a small Transformer encoder, a GRU text model
(Embedding + GRU + Dense head) and a wide MLP regression whose targets sit near 1000
(bfloat16 steps are 16 wide there and 3000 lies halfway between two, so a
bfloat16 output layer misses every target by 8 or more; so uniform 16-bit plans break
the budget there and only a mixed plan keeps the 16-bit speed).

For each model and hardware (`local`: costs measured here; a profile name such as
`rtx4090`: costs predicted for that card, training still on this machine), it runs
`autoprec.search` and prints, per row:

- search wall time;
- the plan's step cost over the cheapest uniform plan that held the budget in the
  search (`plan / best uniform`; at most 1.00 is the goal): for `local` measured here
  side by side in one process, in interleaved rounds (each round times every plan
  once, in rotating order; min and median over the rounds), for a card predicted
  from the search's cost table;
- "16-bit speed recovered": where every uniform 16-bit plan broke the budget, the
  plan's speedup over float32 divided by the fastest uniform 16-bit plan's speedup
  (goal >= 0.90);
- budget held on retraining: the search's own confirmation record
  (`plan.metadata["search"]["confirmation"]`) and an independent retrain here: the
  plan and float32 trained from the same weights for 4x the search's steps, on
  fresh batches, the plan's metric against the budget of float32's.

Usage:
    python bench/search.py [--quick] [--models mobilenetv2,resnet50,...]
                           [--hardware local,rtx4090,rtx3060,rtx2060] [--rounds 7]
                           [--onednn]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import autoprec  # noqa: E402
from autoprec.errors import AutoprecError  # noqa: E402
from autoprec.layers import describe_model  # noqa: E402
from autoprec.runtime.emulation import (  # noqa: E402
    Float16Emulation,
    emulated_layers,
    without_float16,
)
from autoprec.search import Budget, SearchSettings, TrialRecord, search  # noqa: E402
from autoprec.search.space import plan_from_assignment  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/, for its shared `common`
from common import host  # noqa: E402
from common.models import application, encoder_classifier, gru_classifier, mlp  # noqa: E402
from common.timing import MIN_ROUNDS, spread, time_steps  # noqa: E402
from search_report import goals, ratio_table, stage_table, table  # noqa: E402

CLASSES = 10
MODELS = ("gru", "transformer", "wide_mlp", "mobilenetv2", "efficientnetb0", "resnet50")
CARDS = ("rtx4090", "rtx3060", "rtx2060")
#: Where the wide MLP's regression targets sit: halfway between two bfloat16 values (16 apart).
TARGET_OFFSET = 3000.0
#: Batch size per model (the wide MLP and the GRU are cheap per sample).
BATCH_SIZES = {"gru": 32, "wide_mlp": 64}
BUDGET = Budget("val_loss", max_relative_drop=0.02)
#: The regression's loss moves a few percent between precisions while it is still falling.
BUDGETS = {"wide_mlp": Budget("val_loss", max_relative_drop=0.05)}


def build_model(name: str) -> keras.Model:
    """Returns a compiled model by benchmark name."""
    keras.utils.set_random_seed(0)
    loss = "sparse_categorical_crossentropy"
    if name in ("mobilenetv2", "resnet50", "efficientnetb0"):
        model = application(name, 64, CLASSES)
    elif name == "transformer":  # two blocks on 64 positions of 32 float features, width 256
        model = encoder_classifier(
            length=64, features=32, width=256, heads=4, blocks=2, hidden=1024
        )
    elif name == "gru":  # Embedding, one GRU(256), a Dense(256) and the head
        model = gru_classifier(48, recurrent=1, dense=256)
    elif name == "wide_mlp":
        model, loss = build_wide_mlp(), "mse"
    else:
        raise SystemExit(f"unknown model {name!r}; use {', '.join(MODELS)}")
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    return model


def build_wide_mlp() -> keras.Model:
    """A wide MLP regression (3 x Dense(2048) on 256 features); its head's bias starts at the
    targets' mean (`TARGET_OFFSET`)."""
    return mlp(256, 2048, 3, outputs=1, activation=None, head_bias=TARGET_OFFSET, name="wide_mlp")


def make_data(model: keras.Model, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Generated inputs and targets the model can learn in a few dozen steps.

    Images and float sequences are labelled from a fixed random projection of their
    mean over space or time; token sequences by how many of their last 9 tokens lie in
    the lower half of the vocabulary (0 to 9); the wide MLP's
    targets are `TARGET_OFFSET` plus a fixed linear function of four inputs plus noise.
    """
    rng = np.random.default_rng(0)
    shape = tuple(model.inputs[0].shape[1:])
    if model.name == "gru_text":
        vocabulary = model.get_layer("embedding").input_dim
        x = rng.integers(0, vocabulary, size=(samples, *shape)).astype("int32")
        low = (x[:, -(CLASSES - 1) :] < vocabulary // 2).sum(axis=1)
        return x, low.astype("int32")
    x = rng.normal(size=(samples, *shape)).astype("float32")
    if model.name == "wide_mlp":
        weights = rng.normal(size=(4,)).astype("float32") / 2.0
        noise = 0.5 * rng.normal(size=(samples,)).astype("float32")
        return x, (TARGET_OFFSET + x[:, :4] @ weights + noise).astype("float32")[:, None]
    features = x.reshape(samples, -1, shape[-1]).mean(axis=1) if len(shape) > 1 else x
    projection = rng.normal(size=(features.shape[1], CLASSES)).astype("float32")
    return x, np.argmax(features @ projection, axis=1).astype("int32")


def split_data(model: keras.Model, batch_size: int, train_steps: int):
    """Returns `(train, val)`: enough training batches for 8 x `train_steps` (lengthened
    training sees fresh batches) and 16 validation batches."""
    train_samples, val_samples = batch_size * 8 * train_steps, batch_size * 16
    x, y = make_data(model, train_samples + val_samples)
    return (x[:train_samples], y[:train_samples]), (x[train_samples:], y[train_samples:])


def host_line() -> str:
    """`host: <lscpu model name>, <n> cores (<n> usable), load <1-min average>`."""
    return (
        f"host: {host.cpu_model()}, {host.cores()} cores ({host.usable_cores()} usable), "
        f"load {host.load():.1f}"
    )


def warm_start_plans(model: keras.Model, result) -> dict[str, autoprec.PrecisionPlan]:
    """`{label: plan}` of the search's warm starts (the uniform plans as the search ran them)."""
    plans = {}
    for label, entry in result.plan.metadata["search"]["warm_starts"].items():
        assignment = TrialRecord.from_trial(result.study.trials[entry["trial"]]).assignment
        if assignment:
            plans[label] = plan_from_assignment(model, describe_model(model), assignment)
    return plans


def _compiled_copy(model: keras.Model, plan, emulate_float16: bool = False) -> keras.Model:
    """A clone of `model` with `plan` applied and compiled; float16 emulated if asked."""
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    infos = describe_model(clone)
    if emulate_float16 and plan.uses_float16:
        emulation = Float16Emulation(clone)
        emulation.install()
        emulation.set_layers(emulated_layers(plan.resolve(infos)))
        autoprec.apply_plan(clone, without_float16(plan, infos))
        uses_float16 = True
    else:
        uses_float16 = autoprec.apply_plan(clone, plan).uses_float16
    optimizer = keras.optimizers.Adam(1e-3)
    if uses_float16:
        optimizer = autoprec.FlooredLossScaleOptimizer(optimizer)
    clone.compile(optimizer=optimizer, loss=model.loss)
    return clone


def interleaved_step_seconds(
    model: keras.Model, plans: dict, batch, rounds: int = 7, steps: int = 3
) -> dict[str, dict[str, float]]:
    """Train-step seconds of each plan (`{"min", "median"}` over rounds), timed interleaved.

    Each round times `steps` steps of every plan (their mean), in an order rotated
    from round to round, after a warm-up of as many; interleaving puts every plan under
    the same machine load, so their ratios are comparable on a shared, noisy machine.
    """
    copies = {name: _compiled_copy(model, plan) for name, plan in plans.items()}
    x, y = batch
    step_functions = {
        name: lambda copy=copy: copy.train_on_batch(x, y) for name, copy in copies.items()
    }
    times, _ = time_steps(step_functions, max(rounds, MIN_ROUNDS), steps)
    return {name: spread(values) for name, values in times.items()}


def retrain_check(
    model, plan, train, val, batch_size: int, steps: int, budget: Budget, emulate: bool = False
) -> dict:
    """Trains float32 and `plan` from the same weights for `steps` fresh batches; judges the budget.

    With `emulate`, float16 layers are emulated as the search's trials ran them (a card's
    plan retrained on a CPU).

    Returns:
        `{"steps", "float32", "plan", "threshold", "held"}` (metrics are `val_loss`).
    """
    metrics = {}
    x, y = train[0][: steps * batch_size], train[1][: steps * batch_size]
    for name, candidate in (
        ("float32", autoprec.PrecisionPlan.uniform(model, "float32")),
        ("plan", plan),
    ):
        keras.utils.set_random_seed(1)
        copy = _compiled_copy(model, candidate, emulate_float16=emulate)
        copy.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
        metrics[name] = float(
            copy.evaluate(*val, batch_size=batch_size, verbose=0, return_dict=True)["loss"]
        )
    threshold = budget.threshold(metrics["float32"])
    return {
        "steps": steps,
        **metrics,
        "threshold": threshold,
        "held": budget.violation(metrics["float32"], metrics["plan"]) <= 0,
    }


def onednn_bf16_seconds(name: str, batch_size: int) -> float | None:
    """Float32 step time with TF's auto_mixed_precision_onednn_bfloat16 rewrite, in a subprocess."""
    folder = os.path.dirname(os.path.abspath(__file__))
    code = "\n".join(
        [
            f"import sys, json; sys.path.insert(0, {folder!r})",
            "import tensorflow as tf",
            "tf.config.optimizer.set_experimental_options("
            "{'auto_mixed_precision_onednn_bfloat16': True})",
            "import search as bench",
            "from autoprec import cost",
            f"m = bench.build_model({name!r}); x, y = bench.make_data(m, {batch_size})",
            "print(json.dumps(cost.time_train_steps(m, (x, y), ['float32'])['float32'].median))",
        ]
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=1200
    )
    try:
        return float(json.loads(result.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        print(result.stderr[-2000:], file=sys.stderr)
        return None


def _uniform_labels(warm: dict) -> list[str]:
    return [label for label in warm if label == "float32" or label.startswith("uniform")]


def summarise(result, seconds: dict[str, float]) -> dict:
    """Ratios of one search from step seconds per plan (`plan`, `float32` and warm-start labels).

    Args:
        result: the `SearchResult`.
        seconds: `{"plan": s, "float32": s, label: s}`, measured or predicted.

    Returns:
        `best_uniform`, `plan_over_best_uniform`, `uniform16_held`, `recovered` and
        `heuristic_gain` (whether the heuristic's per-layer plan was predicted cheaper
        than every uniform plan within budget).
    """
    meta = result.plan.metadata["search"]
    warm = meta["warm_starts"]
    # A plan the search's longer confirmation found over budget is not within budget.
    missed = {
        attempt["trial"]
        for attempt in (meta.get("confirmation") or {}).get("attempts") or []
        if not attempt["held"]
    }
    held = {
        label: seconds[label]
        for label in _uniform_labels(warm)
        if warm[label]["within_budget"] and warm[label]["trial"] not in missed and label in seconds
    }
    best = min(held, key=held.get) if held else None
    sixteen = {
        label: warm[label]["within_budget"] and warm[label]["trial"] not in missed
        for label in warm
        if label.startswith("uniform")
    }
    recovered = None
    timed16 = [label for label in sixteen if label in seconds]
    if sixteen and not any(sixteen.values()) and timed16:
        fastest = min(timed16, key=seconds.get)
        plan_speedup = seconds["float32"] / seconds["plan"]
        uniform_speedup = seconds["float32"] / seconds[fastest]
        recovered = plan_speedup / uniform_speedup
    predicted_held = [
        entry["predicted_seconds"]
        for label, entry in warm.items()
        if label in _uniform_labels(warm) and entry["within_budget"] and entry["predicted_seconds"]
    ]
    heuristic = warm.get("heuristic", {}).get("predicted_seconds")
    return {
        "best_uniform": best,
        "plan_over_best_uniform": None if best is None else seconds["plan"] / held[best],
        "uniform16_held": sixteen,
        "recovered": recovered,
        "heuristic_gain": bool(heuristic and predicted_held and heuristic < min(predicted_held)),
    }


def _search_columns(result) -> dict:
    meta = result.plan.metadata["search"]
    confirmation = meta.get("confirmation") or {}
    if confirmation.get("run"):
        words = str(confirmation.get("result"))
        attempts = confirmation.get("attempts") or []
        if attempts and attempts[-1].get("metric") is not None:
            words += (
                f" ({confirmation['train_steps']} steps: {attempts[-1]['metric']:.4g} "
                f"≤ {confirmation['threshold']:.4g})"
            )
    else:
        words = "not run: " + (", ".join(confirmation.get("reasons") or []) or "decision clear")
    return {
        "stage_seconds": meta.get("stage_seconds"),
        "train_steps": meta["fidelity_check"]["train_steps"],
        "requested_steps": meta["fidelity_check"]["requested_steps"],
        "budget_status": meta["fidelity_check"]["status"],
        "confirmation": words,
        "confirmation_record": confirmation,
    }


def run_one(name: str, quick: bool, hardware: str = "local", rounds: int = 7, onednn=False) -> dict:
    """Searches one model for one hardware, times or predicts the plans, retrains; returns a row."""
    model = build_model(name)
    batch_size = BATCH_SIZES.get(name, 16)
    train_steps = 4 if quick else 12
    train, val = split_data(model, batch_size, train_steps)
    local = hardware == "local"
    budget = BUDGETS.get(name, BUDGET)
    started = time.perf_counter()
    try:
        result = search(
            model,
            train,
            val,
            budget=budget,
            hardware=hardware,
            n_trials=6 if quick else 16,
            verbose=1,
            settings=SearchSettings(
                steps_per_trial=train_steps,
                batch_size=batch_size,
                cost_batch_size=None if local else 128,
                seed=0,
            ),
        )
    except AutoprecError as error:
        return {"model": name, "hardware": hardware, "error": str(error)}
    wall = time.perf_counter() - started
    plan = result.plan
    row = {
        "model": name,
        "hardware": hardware,
        "trials": len(result.study.trials),
        "wall_s": wall,
        "plan": plan.dtype_counts(),
        "metric": plan.metadata["measured_metric"],
        "reference": result.reference_metric,
        "budget": budget.to_dict(),
        "threshold": budget.threshold(result.reference_metric),
        "replaced_by_measurement": plan.metadata["search"].get("replaced_by_measurement"),
        **_search_columns(result),
    }
    warm = plan.metadata["search"]["warm_starts"]
    if local:
        plans = {
            label: p
            for label, p in warm_start_plans(model, result).items()
            if label in _uniform_labels(warm)
        }
        batch = (train[0][:batch_size], train[1][:batch_size])
        resolved = plan.resolve()
        same = next((label for label, p in plans.items() if p.resolve() == resolved), None)
        row["plan_equals"] = same
        timing = plans if same else {"plan": plan, **plans}
        timed = interleaved_step_seconds(
            model, timing, batch, rounds=rounds, steps=2 if quick else 3
        )
        if same:
            timed["plan"] = timed[same]
        seconds = {label: value["median"] for label, value in timed.items()}
        row["timed_ms"] = {
            label: {kind: 1e3 * value for kind, value in values.items()}
            for label, values in timed.items()
        }
        row.update(summarise(result, seconds))
        fastest = {label: value["min"] for label, value in timed.items()}
        row["plan_over_best_uniform_min"] = (
            None if row["best_uniform"] is None else fastest["plan"] / fastest[row["best_uniform"]]
        )
        if onednn:
            row["onednn_bf16_ms"] = 1e3 * (onednn_bf16_seconds(name, batch_size) or math.nan)
    else:
        speedup = plan.metadata.get("predicted_speedup") or 1.0
        seconds = {
            label: entry["predicted_seconds"]
            for label, entry in warm.items()
            if entry["predicted_seconds"] is not None
        }
        seconds["float32"] = result.float32_predicted_seconds
        seconds["plan"] = result.float32_predicted_seconds / speedup
        row.update(summarise(result, seconds))
    if all(dtype == "float32" for dtype in plan.resolve().values()):
        row["retrain"] = None
    else:
        row["retrain"] = retrain_check(
            model,
            plan,
            train,
            val,
            batch_size,
            4 * row["train_steps"],
            budget,
            emulate=plan.metadata["search"].get("float16_trials") == "emulated",
        )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer trials and steps")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument(
        "--hardware",
        default="local",
        help="comma-separated: local and/or profile names (e.g. local,rtx4090,rtx3060,rtx2060)",
    )
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (>= 5)")
    parser.add_argument(
        "--onednn", action="store_true", help="also time TF's automatic oneDNN bfloat16 rewrite"
    )
    parser.add_argument(
        "--keep-cache",
        action="store_true",
        help="reuse the layer-cost cache (default: a fresh one, so wall times include calibration)",
    )
    arguments = parser.parse_args()
    if not arguments.keep_cache:
        os.environ["AUTOPREC_CACHE_DIR"] = tempfile.mkdtemp(prefix="autoprec-bench-cache-")
    print(host_line(), flush=True)
    rows = []
    for name in arguments.models.split(","):
        for hardware in arguments.hardware.split(","):
            row = run_one(
                name.strip(), arguments.quick, hardware.strip(), arguments.rounds, arguments.onednn
            )
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
            print(ratio_table(rows), flush=True)
    print(host_line())
    print(table(rows))
    print()
    print(ratio_table(rows))
    print()
    print(stage_table(rows))
    print()
    print(goals(rows))


if __name__ == "__main__":
    main()
