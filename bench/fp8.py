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
import collections
import contextlib
import dataclasses
import gc
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import autoprec  # noqa: E402
from autoprec.cost import predict_costs  # noqa: E402
from autoprec.runtime.float8 import extend_optimizer  # noqa: E402

CARDS = ("rtx4090", "rtx5090", "h100")
#: the card the search runs for (by default) and the speedup goal is judged on
GOAL_CARD = "rtx4090"
SPEEDUP_GOAL = 1.3
#: what the search and the heuristic may use
PLAN_DTYPES = ("float32", "bfloat16", "float8")
#: what the cost tables predict
TABLE_DTYPES = ("float32", "bfloat16", "float16", "float8")
UNIFORM = ("float32", "bfloat16", "float8 wherever")
CLASSES = 10
#: fraction of the classifiers' labels replaced by random classes
LABEL_NOISE = 0.2
#: samples of the sample batch the cost tables trace (their shapes matter, not their count)
TRACE_SAMPLES = 2

# ---------------------------------------------------------------------- models and data


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Batch and sequence length (image size for the CNN, `None` for the MLP) of one use."""

    batch: int
    length: int | None

    def describe(self, unit: str) -> str:
        """`batch 8 x sequence 1024 (8,192 tokens)`, or `batch 4096` without a length."""
        if self.length is None:
            return f"batch {self.batch:,}"
        if unit == "image":
            return f"batch {self.batch} x {self.length}x{self.length} images"
        return f"batch {self.batch} x {unit} {self.length} ({self.batch * self.length:,} tokens)"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One benchmark model: how to build it, its data, the shapes it is predicted and trained at.

    Attributes:
        name: the `--models` name.
        kind: a few words on what it is.
        build: builds the uncompiled model (every length is dynamic).
        data: `data(rng, samples, length)` returns `(x, y)` NumPy arrays.
        predicted: the shapes the step times are predicted for.
        trained: the shapes it trains at here.
        unit: what `length` counts (`"sequence"`, `"image"` or `""`).
        learning_rate: Adam's learning rate (3e-3 for every tiny `--quick` model, which
            must learn in three steps).
    """

    name: str
    kind: str
    build: Callable[[], keras.Model]
    data: Callable[[np.random.Generator, int, int | None], tuple[np.ndarray, np.ndarray]]
    predicted: Shapes
    trained: Shapes
    unit: str = "sequence"
    learning_rate: float = 1e-3


def build_gpt(width: int, blocks: int, heads: int, vocabulary: int) -> keras.Model:
    """A pre-norm GPT-style causal decoder over token ids of any length, logits out."""
    layers = keras.layers
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    hidden = layers.Embedding(vocabulary, width, name="embed")(tokens)
    for index in range(blocks):
        name = f"block{index}"
        normed = layers.LayerNormalization(name=f"{name}_ln1")(hidden)
        attended = layers.MultiHeadAttention(heads, width // heads, name=f"{name}_attn")(
            normed, normed, use_causal_mask=True
        )
        hidden = layers.Add(name=f"{name}_add1")([hidden, attended])
        normed = layers.LayerNormalization(name=f"{name}_ln2")(hidden)
        grown = layers.Dense(4 * width, activation="gelu", name=f"{name}_up")(normed)
        hidden = layers.Add(name=f"{name}_add2")(
            [hidden, layers.Dense(width, name=f"{name}_down")(grown)]
        )
    hidden = layers.LayerNormalization(name="final_ln")(hidden)
    logits = layers.Dense(vocabulary, name="lm_head")(hidden)
    return keras.Model(tokens, logits, name="gpt")


def build_encoder(width: int, blocks: int, heads: int, vocabulary: int) -> keras.Model:
    """A post-norm Transformer encoder classifier over token ids of any length, logits out."""
    layers = keras.layers
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    hidden = layers.Embedding(vocabulary, width, name="embed")(tokens)
    for index in range(blocks):
        name = f"block{index}"
        attended = layers.MultiHeadAttention(heads, width // heads, name=f"{name}_attn")(
            hidden, hidden
        )
        hidden = layers.LayerNormalization(name=f"{name}_ln1")(
            layers.Add(name=f"{name}_add1")([hidden, attended])
        )
        grown = layers.Dense(4 * width, activation="gelu", name=f"{name}_up")(hidden)
        shrunk = layers.Dense(width, name=f"{name}_down")(grown)
        hidden = layers.LayerNormalization(name=f"{name}_ln2")(
            layers.Add(name=f"{name}_add2")([hidden, shrunk])
        )
    pooled = layers.GlobalAveragePooling1D(name="pool")(hidden)
    logits = layers.Dense(CLASSES, name="head")(pooled)
    return keras.Model(tokens, logits, name="encoder")


def build_mlp(features: int, width: int, depth: int) -> keras.Model:
    """`depth` x `Dense(width, relu)` and a `Dense` head, logits out."""
    inputs = keras.Input((features,), name="features")
    hidden = inputs
    for index in range(depth):
        hidden = keras.layers.Dense(width, activation="relu", name=f"dense{index}")(hidden)
    logits = keras.layers.Dense(CLASSES, name="head")(hidden)
    return keras.Model(inputs, logits, name="mlp")


def build_cnn(filters: tuple[int, ...], hidden_units: int) -> keras.Model:
    """A `Conv2D` stack (stride 2 after the first) over images of any size, pooling, Dense head."""
    layers = keras.layers
    images = keras.Input((None, None, 3), name="image")
    hidden = images
    for index, count in enumerate(filters):
        hidden = layers.Conv2D(
            count,
            3,
            strides=1 if index == 0 else 2,
            padding="same",
            activation="relu",
            name=f"conv{index}",
        )(hidden)
    pooled = layers.GlobalAveragePooling2D(name="pool")(hidden)
    hidden = layers.Dense(hidden_units, activation="relu", name="fc")(pooled)
    logits = layers.Dense(CLASSES, name="head")(hidden)
    return keras.Model(images, logits, name="cnn")


def next_token_data(vocabulary: int) -> Callable:
    """Tokens from the first `min(vocabulary // 4, 256)` ids; each target a fixed function of its token.

    The first steps learn which ids occur (the loss falls from about log(vocabulary)
    towards log(used)), later ones the mapping.
    """
    used = min(vocabulary // 4, 256)

    def data(rng: np.random.Generator, samples: int, length: int | None):
        tokens = rng.integers(0, used, (samples, length)).astype("int32")
        return tokens, ((tokens * 7 + 3) % used).astype("int32")

    return data


def noisy(rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    """`labels` with a fifth replaced by random classes: the loss stays well above zero."""
    replaced = rng.random(labels.shape) < LABEL_NOISE
    return np.where(replaced, rng.integers(0, CLASSES, labels.shape), labels).astype("int32")


def marker_tokens(vocabulary: int) -> Callable:
    """Random tokens with the class id (a token below `CLASSES`) at about a quarter of positions.

    A fifth of the labels are then replaced by random classes (`noisy`).
    """

    def data(rng: np.random.Generator, samples: int, length: int | None):
        labels = rng.integers(0, CLASSES, samples).astype("int32")
        tokens = rng.integers(CLASSES, vocabulary, (samples, length))
        marked = rng.random((samples, length)) < 0.25
        return np.where(marked, labels[:, None], tokens).astype("int32"), noisy(rng, labels)

    return data


def class_features(features: int) -> Callable:
    """Gaussian features shifted by a fixed random pattern of their class, labels `noisy`."""

    def data(rng: np.random.Generator, samples: int, length: int | None):
        pattern = np.random.default_rng(1234).normal(size=(CLASSES, features))
        labels = rng.integers(0, CLASSES, samples).astype("int32")
        x = rng.normal(size=(samples, features)) + 0.5 * pattern[labels]
        return x.astype("float32"), noisy(rng, labels)

    return data


def offset_images(rng: np.random.Generator, samples: int, length: int | None):
    """Noise images with a per-class channel offset (learnable through pooling)."""
    pattern = np.random.default_rng(1234).normal(size=(CLASSES, 1, 1, 3))
    labels = rng.integers(0, CLASSES, samples).astype("int32")
    images = rng.normal(size=(samples, length, length, 3)) + 1.5 * pattern[labels]
    return images.astype("float32"), labels


def model_specs(quick: bool) -> dict[str, ModelSpec]:
    """The four models at their benchmark sizes, or tiny ones (`quick`)."""
    if quick:
        gpt = dict(width=64, blocks=2, heads=4, vocabulary=256)
        encoder = dict(width=64, blocks=1, heads=4, vocabulary=256)
        mlp = dict(features=64, width=256, depth=3)
        cnn = dict(filters=(8, 16, 32), hidden_units=64)
        token_shapes, token_train = Shapes(4, 64), Shapes(4, 16)
        gpt_train = token_train
        mlp_shapes, mlp_train = Shapes(256, None), Shapes(32, None)
        cnn_shapes, cnn_train = Shapes(8, 32), Shapes(8, 16)
    else:
        gpt = dict(width=1024, blocks=4, heads=16, vocabulary=8192)
        encoder = dict(width=1024, blocks=2, heads=16, vocabulary=8192)
        mlp = dict(features=1024, width=4096, depth=3)
        cnn = dict(filters=(64, 128, 256, 512), hidden_units=1024)
        token_shapes, token_train = Shapes(8, 1024), Shapes(8, 32)
        gpt_train = Shapes(4, 32)  # its steps cost the most here: half the batch
        mlp_shapes, mlp_train = Shapes(4096, None), Shapes(64, None)
        cnn_shapes, cnn_train = Shapes(64, 224), Shapes(32, 32)
    specs = {
        "gpt": ModelSpec(
            "gpt",
            "GPT-style causal decoder ({width} wide, {blocks} blocks, {heads} heads, "
            "vocabulary {vocabulary})".format(**gpt),
            lambda: build_gpt(**gpt),
            next_token_data(gpt["vocabulary"]),
            token_shapes,
            gpt_train,
        ),
        "encoder": ModelSpec(
            "encoder",
            "Transformer encoder classifier ({width} wide, {blocks} blocks, {heads} heads, "
            "vocabulary {vocabulary})".format(**encoder),
            lambda: build_encoder(**encoder),
            marker_tokens(encoder["vocabulary"]),
            token_shapes,
            token_train,
            learning_rate=1e-4,  # a post-norm encoder this wide diverges at first above it
        ),
        "mlp": ModelSpec(
            "mlp",
            "wide MLP ({features} features, {depth} x Dense({width}))".format(**mlp),
            lambda: build_mlp(**mlp),
            class_features(mlp["features"]),
            mlp_shapes,
            mlp_train,
            unit="",
            learning_rate=3e-4,
        ),
        "cnn": ModelSpec(
            "cnn",
            "CNN (Conv2D {filters}, Dense({hidden_units}) head)".format(**cnn),
            lambda: build_cnn(**cnn),
            offset_images,
            cnn_shapes,
            cnn_train,
            unit="image",
        ),
    }
    if quick:
        return {name: dataclasses.replace(spec, learning_rate=3e-3) for name, spec in specs.items()}
    return specs


MODEL_NAMES = ("gpt", "encoder", "mlp", "cnn")
QUICK_MODELS = ("gpt", "mlp")


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


def budget() -> autoprec.Budget:
    """The budget every plan is held to: validation loss at most 2 % above float32's."""
    return autoprec.Budget("val_loss", max_relative_drop=0.02)


def build_copy(spec: ModelSpec, weights: list | None) -> keras.Model:
    """A compiled float32 copy of `spec`'s model, with `weights` if given."""
    keras.utils.set_random_seed(0)
    model = spec.build()
    if weights is not None:
        model.set_weights(weights)
    model.compile(
        optimizer=keras.optimizers.Adam(spec.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def composition(plan: autoprec.PrecisionPlan) -> dict[str, int]:
    """Layers of a plan per dtype."""
    return dict(sorted(collections.Counter(plan.layers.values()).items()))


def layers_in(plan: autoprec.PrecisionPlan, dtype: str) -> list[str]:
    """The paths a plan gives `dtype`."""
    return [path for path, value in plan.layers.items() if value == dtype]


class MessageCapture(logging.Handler):
    """Keeps the lines autoprec logs (its `"autoprec"` logger) while installed."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def captured_messages() -> Iterator[MessageCapture]:
    """Routes autoprec's log lines to a `MessageCapture` instead of any root handler."""
    logger = logging.getLogger("autoprec")
    handler, level, propagate = MessageCapture(), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


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
        with captured_messages() as capture:
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


def time_interleaved(
    steps: dict[str, Callable[[], None]], rounds: int, steps_per_round: int
) -> dict[str, list[float]]:
    """Mean seconds per step of each function, per round, in rounds whose order rotates.

    Each function first runs `steps_per_round` untimed steps (the warm-up).
    """
    names = list(steps)
    for name in names:
        for _ in range(steps_per_round):
            steps[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            for _ in range(steps_per_round):
                steps[name]()
            samples[name].append((time.perf_counter() - started) / steps_per_round)
    return samples


def train_step(model: keras.Model, x: np.ndarray, y: np.ndarray) -> Callable[[], None]:
    """One `train_on_batch` on the fixed batch, synchronised by reading the loss."""

    def step() -> None:
        float(model.train_on_batch(x, y, return_dict=True)["loss"])

    return step


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
    samples = time_interleaved(
        {name: train_step(trained[name].model, x, y) for name in ("float32", "float8 wherever")},
        settings.rounds,
        settings.steps_per_round,
    )
    return {
        name: {
            "min": min(values) * 1e3,
            "median": statistics.median(values) * 1e3,
            "rounds": [value * 1e3 for value in values],
        }
        for name, values in samples.items()
    }


def judge(row: dict[str, Any]) -> None:
    """Adds each plan's speedups over bfloat16, whether it holds the budget, and the checks."""
    plans = row["plans"]
    limits = {
        steps: budget().threshold(loss) for steps, loss in plans["float32"]["val_loss_at"].items()
    }
    row["budget_limit_at"] = limits
    row["budget_limit"] = limits[max(limits)] if limits else None
    for figures in plans.values():
        figures["holds_at"] = {
            steps: bool(loss <= limits[steps]) for steps, loss in figures["val_loss_at"].items()
        }
        at_end = figures["holds_at"]
        figures["holds"] = at_end[max(at_end)] if at_end else None
        figures["speedup_vs_bfloat16"] = {
            card: plans["bfloat16"]["predicted_ms"][card] / ms if ms and math.isfinite(ms) else 0.0
            for card, ms in figures["predicted_ms"].items()
        }
    row["best_uniform"] = {}
    for card in CARDS:
        holding = [name for name in UNIFORM if plans[name]["holds"]]
        row["best_uniform"][card] = (
            min(holding, key=lambda name: plans[name]["predicted_ms"][card]) if holding else None
        )
    row["not_slower_checks"] = [
        not_slower_check(plans, name, row["best_uniform"])
        for name in plans
        if name.partition(" ")[0] in ("search", "heuristic")
    ]


def not_slower_check(
    plans: Mapping[str, Any], name: str, best_uniform: Mapping[str, str | None]
) -> dict[str, Any]:
    """The second goal for one plan, on the card it was made for."""
    card = name.partition(" ")[2]
    best = best_uniform[card]
    check: dict[str, Any] = {"plan": name, "card": card, "best_uniform": best}
    check["holds"] = plans[name]["holds"]
    if best is None:
        return {**check, "ratio": None, "pass": False}
    ratio = plans[name]["predicted_ms"][card] / plans[best]["predicted_ms"][card]
    return {**check, "ratio": ratio, "pass": bool(ratio <= 1.0 + 1e-9)}


# ---------------------------------------------------------------------- goals and printing


def goals(rows: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """The two goals over every model's row, with the figures they were judged on."""
    result: dict[str, Any] = {}
    gpt = rows.get("gpt")
    if gpt is not None and "plans" in gpt:
        candidates = []
        for name in (f"search {GOAL_CARD}", f"heuristic {GOAL_CARD}", "float8 wherever"):
            figures = gpt["plans"].get(name)
            if figures is not None:
                speedup = figures["speedup_vs_bfloat16"][GOAL_CARD]
                candidates.append({"plan": name, "speedup": speedup, "holds": figures["holds"]})
        passing = [
            item
            for item in candidates
            if item["plan"] != "float8 wherever"
            and item["holds"]
            and item["speedup"] >= SPEEDUP_GOAL
        ]
        result["gpt_speedup"] = {"candidates": candidates, "pass": bool(passing)}
    checks = [
        {"model": name, **check}
        for name, row in rows.items()
        for check in row.get("not_slower_checks", [])
    ]
    result["not_slower"] = {
        "checks": checks,
        "pass": bool(checks) and all(check["pass"] for check in checks),
        **{
            f"{kind}_pass": all(check["pass"] for check in checks if check["plan"].startswith(kind))
            for kind in ("search", "heuristic")
        },
    }
    return result


def host_description() -> dict[str, Any]:
    """The CPU's model name (`lscpu`), core count and the frameworks' versions."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        text = ""
    model = platform.processor() or platform.machine()
    for line in text.splitlines():
        if line.lower().startswith("model name"):
            model = line.split(":", 1)[1].strip()
    import tensorflow as tf

    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "keras": keras.__version__,
        "tensorflow": tf.__version__,
        "autoprec": autoprec.__version__,
    }


def cell(ms: float, speedup: float) -> str:
    """`  30.01 1.27x` (predicted ms and speedup over bfloat16), or `infeasible`."""
    if not math.isfinite(ms):
        return f"{'infeasible':>14}"
    return f"{ms:8.2f} {speedup:5.2f}x"


def print_model(name: str, row: dict[str, Any]) -> None:
    """The model's table (plans x cards), its plans, search, CPU timing and checks."""
    print(f"\n== {name}: {row['kind']}, {row.get('parameters', 0):,} parameters")
    print(
        f"  predicted at {row['predicted_shapes']}; trained here at {row['trained_shapes']} "
        "(same model, shorter inputs)"
    )
    plans = row.get("plans", {})
    if plans:
        print_table(plans, row.get("budget_limit_at", {}))
        print_plans(plans)
    for card, lines in row.get("heuristic_messages", {}).items():
        for line in lines:
            if "predicted step" in line or "no float8" in line:
                print(f"  | heuristic {card}: {line.removeprefix('autoprec.heuristic: ')}")
    for card, record in row.get("search", {}).items():
        print_search(card, record, plans.get(f"search {card}"))
    print_cpu_timing(row.get("cpu_step_ms"))
    for check in row.get("not_slower_checks", []):
        print_not_slower(name, check, plans)
    for what, error in row.get("errors", {}).items():
        print(f"  ERROR {what}: {error[:600]}")
    searches = ", ".join(f"{card} {seconds:.0f} s" for card, seconds in row["search_s"].items())
    stages = ", ".join(f"{stage} {seconds:.0f}" for stage, seconds in row["stage_s"].items())
    print(f"  search: {searches or 'none'}; ({row['wall_s']:.0f} s: {stages})")


def print_table(plans: Mapping[str, Any], limits: Mapping[int, float]) -> None:
    """Rows = plans; predicted ms and speedup over bfloat16 per card, val_loss, budget held."""
    checkpoints = sorted(limits)
    header = "".join(f" {card + ' ms':>8} {'/bf16':>6}" for card in CARDS)
    losses = "".join(f" {'loss@' + str(steps):>9}" for steps in checkpoints)
    steps_text = "/".join(f"@{steps}" for steps in checkpoints)
    print(f"  {'plan':<18}{header}{losses}  holds budget {steps_text}")
    for plan, figures in plans.items():
        cells = "".join(
            " " + cell(figures["predicted_ms"][card], figures["speedup_vs_bfloat16"][card])
            for card in CARDS
        )
        loss_at, holds_at = figures.get("val_loss_at", {}), figures.get("holds_at", {})
        losses = "".join(
            f" {loss_at[steps]:9.4f}" if steps in loss_at else f" {'-':>9}" for steps in checkpoints
        )
        holds = (
            "/".join("yes" if holds_at[steps] else "NO" for steps in checkpoints)
            if holds_at
            else "- (predicted only)"
        )
        same = f" (= {figures['same_as']})" if "same_as" in figures else ""
        print(f"  {plan:<18}{cells}{losses}  {holds}{same}")
    limits_text = ", ".join(f"{limits[steps]:.4f} @{steps}" for steps in checkpoints)
    if limits:
        print(
            f"  budget: val_loss at most float32's + 2 % ({limits_text} steps); a plan holds it "
            f"when it does @{checkpoints[-1]}"
        )


def print_plans(plans: Mapping[str, Any]) -> None:
    """The heuristic's and the search's plans: dtypes, float32 layers, float8 layers left out."""
    for plan, figures in plans.items():
        if not plan.startswith(("heuristic", "search")) or "same_as" in figures:
            continue
        parts = ", ".join(f"{count} {dtype}" for dtype, count in figures["composition"].items())
        print(f"  {plan} plan: {parts}")
        if figures["float32_layers"]:
            print(f"    float32: {', '.join(figures['float32_layers'])}")
        outside = [
            path
            for path in plans["float8 wherever"]["float8_layers"]
            if path not in figures["float8_layers"]
        ]
        if outside:
            print(f"    not float8 (float8 in 'float8 wherever'): {', '.join(outside)}")


def print_search(card: str, record: Mapping[str, Any], returned: Mapping[str, Any] | None) -> None:
    """The search's trials within budget (fastest first) and a note if it returned a slower plan."""
    points = record["within_budget"]
    tried = "; ".join(f"{point['label']} {point['predicted_ms']:.2f} ms" for point in points)
    print(
        f"  search {card}: {record['trials']} trials, float32 reference val_loss "
        f"{record['reference_metric']:.4f}; within budget in its own trials: {tried or 'none'}"
    )
    missed = "; ".join(
        f"{point['label']} {point['predicted_ms']:.2f} ms (val_loss {point['metric']:.4f})"
        if point["metric"] is not None
        else f"{point['label']} {point['predicted_ms']:.2f} ms"
        for point in record["missed"]
    )
    if missed:
        print(f"    missed its budget in the search: {missed}")
    skipped = (record.get("finalists") or {}).get("skipped") or {}
    for label, why in skipped.items():
        print(f"    finalist {label} skipped: {why}")
    if points and returned is not None:
        chosen, fastest = returned["predicted_ms"][card], points[0]
        if chosen > fastest["predicted_ms"] * (1 + 1e-6):
            print(
                f"    NOTE: the search returned a plan predicted at {chosen:.2f} ms, slower than "
                f"its own fastest trial within budget ({fastest['label']}, "
                f"{fastest['predicted_ms']:.2f} ms)"
            )


def print_cpu_timing(timing: Mapping[str, Any] | None) -> None:
    """What float8 emulation costs here: float8 wherever against float32, min and median."""
    if not timing:
        return
    f32, f8 = timing["float32"], timing["float8 wherever"]
    print(
        f"  CPU step here (float8 emulated), {len(f32['rounds'])} interleaved rounds: float32 "
        f"{f32['min']:.1f} ms min / {f32['median']:.1f} median; float8 wherever "
        f"{f8['min']:.1f} / {f8['median']:.1f}: {f8['min'] / f32['min']:.2f}x / "
        f"{f8['median'] / f32['median']:.2f}x float32"
    )


def print_not_slower(model: str, check: dict[str, Any], plans: Mapping[str, Any]) -> None:
    """One PASS/FAIL line of the second goal."""
    plan, card, best = check["plan"], check["card"], check["best_uniform"]
    if best is None:
        print(f"  FAIL {model} {plan}: no uniform plan holds the budget, nothing to compare with")
        return
    mine, theirs = plans[plan]["predicted_ms"][card], plans[best]["predicted_ms"][card]
    verdict = "PASS" if check["pass"] else "FAIL"
    budget_text = {True: "holds", False: "does NOT hold", None: "not retrained for"}[check["holds"]]
    print(
        f"  {verdict} {model} {plan}: {mine:.2f} ms on {card}, {check['ratio']:.3f}x the best "
        f"uniform plan holding the budget ({best}, {theirs:.2f} ms); {budget_text} its budget"
    )


def print_goals(result: Mapping[str, Any]) -> None:
    """The goals' verdicts with their figures."""
    print("\n== goals (budgets as held at the longer retraining)")
    speed = result.get("gpt_speedup")
    if speed is not None:
        words = {True: "holds", False: "does not hold", None: "not retrained"}
        figures = "; ".join(
            f"{item['plan']} {item['speedup']:.2f}x ({words[item['holds']]})"
            for item in speed["candidates"]
        )
        print(
            f"  {'PASS' if speed['pass'] else 'FAIL'} gpt on {GOAL_CARD}: searched or heuristic "
            f"plan >= {SPEEDUP_GOAL:.1f}x uniform bfloat16 while holding its budget: {figures}"
        )
    slower = result["not_slower"]
    print(
        f"  {'PASS' if slower['pass'] else 'FAIL'} no searched or heuristic plan predicted "
        "slower, on its card, than the fastest uniform plan (float32, bfloat16, float8 "
        "wherever) holding the budget:"
    )
    for kind in ("search", "heuristic"):
        failing = [
            check
            for check in slower["checks"]
            if check["plan"].startswith(kind) and not check["pass"]
        ]
        summary = "; ".join(
            f"{check['model']} {check['plan']} "
            + (
                f"{check['ratio']:.3f}x {check['best_uniform']}"
                if check["ratio"] is not None
                else "no uniform plan holds"
            )
            for check in failing
        )
        verdict = "PASS" if slower[f"{kind}_pass"] else "FAIL"
        print(f"    {verdict} {kind}: {summary or 'every plan at most 1.000x'}")


def finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by `None` (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    if isinstance(value, (np.floating, np.integer)):
        return finite(value.item())
    return value


def write_json(path: str, report: dict[str, Any]) -> None:
    """Writes `report` to `path` atomically (a temporary file in the same folder, then a rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(handle, "w") as file:
            json.dump(finite(report), file, indent=1, default=str, allow_nan=False)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


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
    with tempfile.TemporaryDirectory() as cache_dir:
        previous = os.environ.get("AUTOPREC_CACHE_DIR")
        os.environ["AUTOPREC_CACHE_DIR"] = cache_dir
        try:
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
        finally:
            if previous is None:
                os.environ.pop("AUTOPREC_CACHE_DIR", None)
            else:
                os.environ["AUTOPREC_CACHE_DIR"] = previous
    report["goals"] = goals(report["models"])
    print_goals(report["goals"])
    report["wall_s"] = time.perf_counter() - started
    print(f"({report['wall_s']:.0f} s)")
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
