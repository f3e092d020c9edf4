"""The float8 benchmark: predicted FP8 gains on RTX 4090, RTX 5090 and H100, budgets checked here.

For each model (built here, random weights, synthetic data made here with a fixed seed,
nothing downloaded):

- `gpt`: a GPT-style causal decoder (token `Embedding`, pre-norm blocks of causal
  `MultiHeadAttention` + `LayerNormalization` + MLP `Dense(4w, gelu) -> Dense(w)` with
  residuals, an `lm_head` `Dense(vocab)`), width 1024;
- `encoder`: a post-norm Transformer encoder classifier, width 1024;
- `mlp`: a wide MLP (3 x `Dense(4096)`);
- `cnn`: a `Conv2D` stack, global pooling and a `Dense` head;

the plans compared are `float32` and uniform `bfloat16` (`PrecisionPlan.uniform`),
`float8` wherever Keras allows it (`PrecisionPlan.uniform(model, "float8")`: every
`Dense`/`EinsumDense` in float8, the rest bfloat16), the heuristic's plan for each card
(`autoprec.heuristic_plan` on `predict_costs` of that card) and the searched plan
(`autoprec.search(..., hardware="rtx4090", settings=SearchSettings(dtypes=("float32",
"bfloat16", "float8"), ...))`).

Each plan's step time is predicted for each card (`autoprec.estimate(..., costs=table,
batch_size=...)`, the table from `predict_costs` at realistic shapes: FP8 pays only for
large matrix products, so the decoder and the encoder are predicted at batch 8 x
sequence 1024 (8192 tokens per step), the MLP at 4096 rows, the CNN at batch 64 of
224x224 images). The models take any sequence length (image size for the CNN), so one
model is predicted at those shapes and trained here at short ones (sequence 32, 32x32
images): the search is given the realistic cost table (`SearchSettings.costs`,
`cost_batch_size`), its trials train at the short shapes.

The budget is `val_loss` at most 2 % above float32's. It is checked by retraining here on
the CPU (Keras emulates float8 there: quantize and dequantize around float32 matrix
products): every distinct plan is applied with `autoprec.apply_plan` to a fresh copy with
the same initial weights and trained on the same batches, in order, as the search's
trials take them; its validation loss is read after the search's steps (4) and at the end
(8 steps), and a plan holds the budget when it does at the end. The heuristic's plans
for cards that are neither searched for nor the goal's are predicted only. What the
emulation costs here is timed too: the whole train step of the float8-wherever copy
against the float32 copy, in interleaved rounds (min and median). The classifiers'
labels are a fifth random, so that their losses stay well above zero and 2 % of them
means something.

Goals, printed as PASS/FAIL lines with their figures:

1. on the GPT decoder, on `rtx4090`, the searched (or the heuristic's) plan is predicted
   at least 1.3x faster than uniform bfloat16 while holding its budget;
2. no plan of autoprec (searched, heuristic) is predicted slower, on the card it was
   made for, than the fastest of the uniform plans (float32, bfloat16, float8 wherever
   allowed) that hold the budget here.

Run:

    python bench/fp8.py [--quick] [--models gpt,mlp] [--trials 4] [--search-steps 4]
                        [--train-steps 8] [--rounds 5] [--search-hardware rtx4090]
                        [--json figures.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import autoprec  # noqa: E402
from autoprec.cost import predict_costs  # noqa: E402
from autoprec.runtime.float8 import extend_optimizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/, for its shared `common`
from common.host import cores, cpu_model, environment, versions  # noqa: E402
from common.keras_tools import (  # noqa: E402
    captured_messages,
    compile_adam,
    composition,
    fresh_copy,
    train_step,
)
from common.report import write_json  # noqa: E402
from common.timing import milliseconds, time_steps  # noqa: E402
from fp8_models import (  # noqa: E402
    CARDS,
    GOAL_CARD,
    MODEL_NAMES,
    PLAN_DTYPES,
    QUICK_MODELS,
    ModelSpec,
    budget,
    model_specs,
)
from fp8_report import goals, judge, print_goals, print_model  # noqa: E402

#: what the cost tables predict
TABLE_DTYPES = ("float32", "bfloat16", "float16", "float8")
#: samples of the sample batch the cost tables trace (their shapes matter, not their count)
TRACE_SAMPLES = 2

# ---------------------------------------------------------------------- plans and predictions


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every model's row runs with."""

    quick: bool
    trials: int
    search_steps: int
    train_steps: int
    validation_batches: int
    rounds: int
    steps_per_round: int
    search_cards: tuple[str, ...]

    @property
    def checkpoints(self) -> tuple[int, ...]:
        """The retraining's evaluations: at the search's steps, and at the end."""
        return tuple(sorted({self.search_steps, self.train_steps}))


def build_copy(spec: ModelSpec, weights: list | None) -> keras.Model:
    """A compiled float32 copy of `spec`'s model, with `weights` if given."""

    def compile_model(model: keras.Model) -> None:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        compile_adam(model, loss, spec.learning_rate)

    return fresh_copy(spec.build, weights, compile_with=compile_model)


def layers_in(plan: autoprec.PrecisionPlan, dtype: str) -> list[str]:
    """The paths a plan gives `dtype`."""
    return [path for path, value in plan.layers.items() if value == dtype]


def cost_tables(
    model: keras.Model, spec: ModelSpec, sample: np.ndarray
) -> dict[str, autoprec.CostTable]:
    """Each card's predicted cost table at the realistic shapes (the sample gives the length)."""
    return {
        card: predict_costs(
            model, card, batch_size=spec.predicted.batch, x=sample, dtypes=TABLE_DTYPES
        )
        for card in CARDS
    }


def predicted_ms(
    model: keras.Model,
    plan: autoprec.PrecisionPlan,
    tables: Mapping[str, autoprec.CostTable],
    batch: int,
) -> dict[str, float]:
    """The plan's predicted train step on each card, in milliseconds (`inf`: infeasible)."""
    return {
        card: autoprec.estimate(model, plan, card, costs=table, batch_size=batch).step_seconds * 1e3
        for card, table in tables.items()
    }


def heuristic_plans(
    model: keras.Model, tables: Mapping[str, autoprec.CostTable]
) -> tuple[dict[str, autoprec.PrecisionPlan], dict[str, list[str]]]:
    """The heuristic's plan for each card, and the lines it logged deciding it."""
    plans, messages = {}, {}
    for card, table in tables.items():
        with captured_messages(keras_logging_off=False) as capture:
            plans[card] = autoprec.heuristic_plan(
                model, costs=table, hardware=card, dtypes=PLAN_DTYPES
            )
        messages[card] = capture.lines
    return plans, messages


def searched_plan(
    model: keras.Model,
    spec: ModelSpec,
    data: TrainingData,
    table: autoprec.CostTable,
    card: str,
    settings: Settings,
) -> autoprec.SearchResult:
    """`autoprec.search` for `card` with float8 in its space, costs at the realistic shapes."""
    return autoprec.search(
        model,
        (data.x, data.y),
        validation_data=(data.x_val, data.y_val),
        budget=budget(),
        hardware=card,
        n_trials=settings.trials,
        verbose=0,
        settings=autoprec.SearchSettings(
            batch_size=spec.trained.batch,
            steps_per_trial=settings.search_steps,
            validation_steps=settings.validation_batches,
            seed=0,
            dtypes=PLAN_DTYPES,
            costs=table,
            cost_batch_size=spec.predicted.batch,
            confirm_steps=0,  # the plans are retrained here instead
            measure_speedup=False,
        ),
    )


def search_record(result: autoprec.SearchResult) -> dict[str, Any]:
    """What a search tried and chose: its trials within budget (fastest first) and finalists."""
    metadata = dict(result.plan.metadata.get("search") or {})
    points = sorted(
        (
            {
                "trial": point.trial,
                "label": point.label or f"trial {point.trial}",
                "predicted_ms": point.predicted_seconds * 1e3,
                "metric": point.metric,
                "feasible": point.feasible,
                "counts": {dtype: count for dtype, count in point.counts.items() if count},
            }
            for point in result.points
        ),
        key=lambda point: point["predicted_ms"],
    )
    return {
        "trials": len(result.study.trials),
        "reference_metric": result.reference_metric,
        "within_budget": [point for point in points if point["feasible"]],
        "missed": [point for point in points if not point["feasible"]],
        "finalists": metadata.get("finalists"),
    }


# ---------------------------------------------------------------------- training check


@dataclasses.dataclass(frozen=True)
class TrainingData:
    """The batches every plan trains on here and the validation data it is judged on."""

    x: np.ndarray
    y: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    batch: int


def training_data(spec: ModelSpec, settings: Settings) -> TrainingData:
    """`train_steps` batches and `validation_batches` validation batches at the trained shapes."""
    batch, length = spec.trained.batch, spec.trained.length
    steps = max(settings.train_steps, settings.search_steps)
    x, y = spec.data(np.random.default_rng(0), batch * steps, length)
    x_val, y_val = spec.data(np.random.default_rng(1), batch * settings.validation_batches, length)
    return TrainingData(x, y, x_val, y_val, batch)


@dataclasses.dataclass(frozen=True)
class Trained:
    """One plan trained here: its validation loss after each checkpoint, its copy, its seconds.

    Attributes:
        val_loss: `{steps: validation loss after that many steps}`.
        model: the trained copy (timed afterwards).
        seconds: building, applying, training and evaluating it.
    """

    val_loss: dict[int, float]
    model: keras.Model
    seconds: float


def train_plan(
    spec: ModelSpec,
    weights: list,
    plan: autoprec.PrecisionPlan | None,
    data: TrainingData,
    checkpoints: tuple[int, ...],
) -> Trained:
    """Applies `plan` to a fresh copy with `weights`, trains it and evaluates it at each checkpoint.

    The batches are taken in order, as the search's trials take them: the first
    checkpoint is the search's fidelity, the last the longer retraining.
    """
    started = time.perf_counter()
    model = build_copy(spec, weights)
    if plan is not None:
        autoprec.apply_plan(model, plan, x=data.x[: data.batch])
        extend_optimizer(model)  # a float8 layer's scaling variables are trainable
    losses, done = {}, 0
    for steps in sorted(set(checkpoints)):
        model.fit(
            data.x[done * data.batch : steps * data.batch],
            data.y[done * data.batch : steps * data.batch],
            batch_size=data.batch,
            epochs=1,
            shuffle=False,
            verbose=0,
        )
        loss = model.evaluate(data.x_val, data.y_val, batch_size=data.batch, verbose=0)
        losses[steps], done = float(loss[0] if isinstance(loss, list) else loss), steps
    return Trained(losses, model, time.perf_counter() - started)


# ---------------------------------------------------------------------- one model


def distinct_plans(
    plans: Mapping[str, autoprec.PrecisionPlan],
) -> dict[str, str]:
    """`{name: name of the first plan with the same layers}`: which ones need training."""
    first: dict[tuple, str] = {}
    same: dict[str, str] = {}
    for name, plan in plans.items():
        key = tuple(sorted(plan.layers.items()))
        same[name] = first.setdefault(key, name)
    return same


def run_model(spec: ModelSpec, settings: Settings) -> dict[str, Any]:
    """Predicts, searches, retrains and times one model; its row of figures."""
    started = clock = time.perf_counter()
    stages: dict[str, float] = {}
    row: dict[str, Any] = {"kind": spec.kind, "errors": {}}
    row["predicted_shapes"] = spec.predicted.describe(spec.unit)
    row["trained_shapes"] = spec.trained.describe(spec.unit)
    data = training_data(spec, settings)
    reference = build_copy(spec, None)
    weights = reference.get_weights()
    row["parameters"] = int(reference.count_params())
    sample = spec.data(np.random.default_rng(2), TRACE_SAMPLES, spec.predicted.length)[0]
    tables = cost_tables(reference, spec, sample)
    stages["predict"], clock = time.perf_counter() - clock, time.perf_counter()

    plans = candidate_plans(reference, tables, spec, data, settings, row)
    stages["search"], clock = sum(row["search_s"].values()), time.perf_counter()
    row["plans"] = {
        name: plan_figures(reference, name, plan, tables, spec.predicted.batch, row["errors"])
        for name, plan in plans.items()
    }
    stages["estimate"], clock = time.perf_counter() - clock, time.perf_counter()
    trained = retrain(spec, weights, plans, data, settings, row)
    stages["train"], clock = time.perf_counter() - clock, time.perf_counter()
    judge(row)
    if "float32" in trained and "float8 wherever" in trained:
        row["cpu_step_ms"] = cpu_step_ms(trained, data, settings)
    stages["cpu timing"] = time.perf_counter() - clock
    row["stage_s"] = stages
    row["wall_s"] = time.perf_counter() - started
    del trained, reference
    gc.collect()
    return row


def candidate_plans(
    reference: keras.Model,
    tables: Mapping[str, autoprec.CostTable],
    spec: ModelSpec,
    data: TrainingData,
    settings: Settings,
    row: dict[str, Any],
) -> dict[str, autoprec.PrecisionPlan]:
    """The uniform plans, the heuristic's plan per card and the searched plans.

    The heuristic's messages, each search's record and seconds, and a failing
    search's error go into `row`.
    """
    plans = {
        "float32": autoprec.PrecisionPlan.uniform(reference, "float32"),
        "bfloat16": autoprec.PrecisionPlan.uniform(reference, "bfloat16"),
        "float8 wherever": autoprec.PrecisionPlan.uniform(reference, "float8"),
    }
    heuristics, row["heuristic_messages"] = heuristic_plans(reference, tables)
    plans.update({f"heuristic {card}": plan for card, plan in heuristics.items()})
    row["search_s"] = {}
    for card in settings.search_cards:
        clock = time.perf_counter()
        try:
            result = searched_plan(reference, spec, data, tables[card], card, settings)
            plans[f"search {card}"] = result.plan
            row.setdefault("search", {})[card] = search_record(result)
        except Exception as error:  # a failing search is reported, the rest still runs
            row["errors"][f"search {card}"] = f"{type(error).__name__}: {error}"
        row["search_s"][card] = time.perf_counter() - clock
    return plans


def plan_figures(
    reference: keras.Model,
    name: str,
    plan: autoprec.PrecisionPlan,
    tables: Mapping[str, autoprec.CostTable],
    batch: int,
    errors: dict[str, str],
) -> dict[str, Any]:
    """A plan's composition and its predicted step on each card (an estimate error recorded)."""
    try:
        figures = predicted_ms(reference, plan, tables, batch)
    except Exception as error:
        errors[f"estimate {name}"] = f"{type(error).__name__}: {error}"
        figures = {card: math.nan for card in CARDS}
    return {
        "composition": composition(plan),
        "float8_layers": layers_in(plan, "float8"),
        "float32_layers": layers_in(plan, "float32"),
        "predicted_ms": figures,
    }


def retrain(
    spec: ModelSpec,
    weights: list,
    plans: Mapping[str, autoprec.PrecisionPlan],
    data: TrainingData,
    settings: Settings,
    row: dict[str, Any],
) -> dict[str, Trained]:
    """Trains each distinct plan that is judged; writes every plan's losses into `row`.

    A heuristic plan for a card that is neither searched for nor the goal's is
    predicted only.
    """
    trained: dict[str, Trained] = {}
    same = distinct_plans(plans)
    judged = {f"heuristic {card}" for card in {GOAL_CARD, *settings.search_cards}}
    for name, plan in plans.items():
        if same[name] != name:
            row["plans"][name]["same_as"] = same[name]
            continue
        if name.startswith("heuristic") and name not in judged:
            continue
        try:
            trained[name] = train_plan(
                spec, weights, None if name == "float32" else plan, data, settings.checkpoints
            )
        except Exception as error:
            row["errors"][f"train {name}"] = f"{type(error).__name__}: {error}"
    for name in plans:
        source = trained.get(same[name])
        losses = {} if source is None else source.val_loss
        row["plans"][name]["val_loss_at"] = losses
        row["plans"][name]["val_loss"] = losses[max(losses)] if losses else None
        row["plans"][name]["train_s"] = None if source is None else source.seconds
    return trained


def cpu_step_ms(
    trained: Mapping[str, Trained], data: TrainingData, settings: Settings
) -> dict[str, dict[str, Any]]:
    """The float32 and float8-wherever copies' train steps here, interleaved: min, median, rounds."""
    x, y = data.x[: data.batch], data.y[: data.batch]
    samples, _ = time_steps(
        {name: train_step(trained[name].model, x, y) for name in ("float32", "float8 wherever")},
        settings.rounds,
        settings.steps_per_round,
    )
    keys = ("min", "median", "rounds")
    return {name: milliseconds(values, keys) for name, values in samples.items()}


# ---------------------------------------------------------------------- host


def host_description() -> dict[str, Any]:
    """The CPU's model name (`lscpu`), core count and the frameworks' versions."""
    return {"cpu": cpu_model(), "cores": cores(), **versions("keras", "tensorflow", "autoprec")}


# ---------------------------------------------------------------------- entry point


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help=f"comma-separated, of {', '.join(MODEL_NAMES)}")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"tiny sizes, {' and '.join(QUICK_MODELS)} only, 3 and 4 steps (the smoke test)",
    )
    parser.add_argument(
        "--search-hardware",
        default=GOAL_CARD,
        help=f"comma-separated cards to search for, of {', '.join(CARDS)} (default {GOAL_CARD})",
    )
    parser.add_argument(
        "--trials", type=int, default=4, help="search trials (default 4: its warm starts)"
    )
    parser.add_argument("--search-steps", type=int, help="training steps per trial (4; quick 3)")
    parser.add_argument(
        "--train-steps",
        type=int,
        help="training steps of the retraining check (8; quick 4); also judged at --search-steps",
    )
    parser.add_argument("--rounds", type=int, help="interleaved CPU timing rounds (5; quick 2)")
    parser.add_argument("--json", help="write the figures there (atomically)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark; prints the tables and goals and returns (and optionally writes) them."""
    args = parse(argv)
    names = (
        args.models.split(",") if args.models else list(QUICK_MODELS if args.quick else MODEL_NAMES)
    )
    unknown = [name for name in names if name not in MODEL_NAMES]
    cards = tuple(card for card in args.search_hardware.split(",") if card)
    if unknown or any(card not in CARDS for card in cards):
        raise SystemExit(
            f"fp8.py: unknown --models {unknown} or --search-hardware {list(cards)}; models: "
            f"{', '.join(MODEL_NAMES)}; cards: {', '.join(CARDS)}"
        )
    settings = Settings(
        quick=args.quick,
        trials=args.trials,
        search_steps=args.search_steps or (3 if args.quick else 4),
        train_steps=args.train_steps or (4 if args.quick else 8),
        validation_batches=2,
        rounds=args.rounds or (2 if args.quick else 5),
        steps_per_round=1,
        search_cards=cards,
    )
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)  # retracing notices
    started = time.perf_counter()
    host = host_description()
    print(
        f"host: {host['cpu']} ({host['cores']} CPU cores), Keras {host['keras']}, "
        f"TF {host['tensorflow']}, autoprec {host['autoprec']}"
    )
    print(
        f"settings: cards {', '.join(CARDS)}; search for {', '.join(cards) or 'none'}: "
        f"{settings.trials} trials x {settings.search_steps} steps, dtypes {'/'.join(PLAN_DTYPES)}; "
        f"retraining {settings.train_steps} steps per plan; {settings.rounds} CPU timing rounds"
        + ("; quick: tiny sizes, figures not conclusive" if args.quick else "")
    )
    specs = model_specs(args.quick)
    report: dict[str, Any] = {
        "host": host,
        "settings": dataclasses.asdict(settings),
        "models": {},
    }
    with tempfile.TemporaryDirectory() as cache_dir, environment("AUTOPREC_CACHE_DIR", cache_dir):
        for name in names:
            try:
                row = run_model(specs[name], settings)
            except Exception as error:  # one broken model does not stop the others
                row = {
                    "kind": specs[name].kind,
                    "errors": {"model": f"{type(error).__name__}: {error}"},
                }
                print(f"\n== {name}: ERROR {row['errors']['model'][:600]}")
            else:
                print_model(name, row)
            report["models"][name] = row
            sys.stdout.flush()
            if args.json:
                write_json(args.json, report)
    report["goals"] = goals(report["models"])
    print_goals(report["goals"])
    report["wall_s"] = time.perf_counter() - started
    print(f"({report['wall_s']:.0f} s)")
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
