"""The "never slower" benchmark: the one-liner and the search's plan against Keras' uniform policies.

For each model (CNNs with and without depthwise convolutions, DenseNet121, a
Transformer encoder, two keras-hub decoders, a GRU text model, a wide MLP; data
generated here with a fixed seed, nothing downloaded) the candidates are:

- `float32`: the model as built;
- `mixed_bfloat16` (and `mixed_float16` where float16 is fast here, or with
  `--float16`): the same architecture built under
  `keras.config.set_dtype_policy(...)`, exactly as Keras applies that policy;
- `one-liner`: `model.fit(..., callbacks=[autoprec.AutoPrecision()])` for one short
  epoch on a copy (costs measured here, `hardware="local"`); its `callback.plan` is
  applied to a fresh copy with `autoprec.apply_plan`;
- `search`: `autoprec.search(..., hardware="local", n_trials=...)`; its
  `result.plan` applied to a fresh copy likewise.

Every candidate starts from the same initial weights and is compiled with the same
optimizer and loss. The whole train step (`train_on_batch` on one fixed batch,
synchronised by reading the loss) of all candidates is timed in interleaved rounds
whose order rotates, after a warm-up of as many steps as a timed round. A round's
figure is the mean step time of its steps; the table gives the minimum and the median
over rounds, and the ratio of the one-liner's and the search's plan to the best
uniform policy. Each model's row also gives the plans' composition (layers per
dtype), what the one-liner reported and recorded (`plan.metadata`), and the time the
one-liner added to the first epoch (fit with `AutoPrecision()` minus fit without,
same steps, both from a fresh copy; the cost cache starts empty unless `--cache-dir`).
The search's budget is `Budget("val_loss", max_relative_drop=0.05)`; for the models with
BatchNormalization its trivial-baseline check is off (moving statistics do not settle
in a few steps, so inference-mode validation loss cannot show learning that soon).

The goal: no model above 1.00x of the best uniform policy beyond noise (at most 1.03x
on the minimum), and a geometric mean below 1.00x over the models where 16-bit pays
on this host (a uniform 16-bit policy more than 5 % faster than float32). Ratios
within ~5 % of each other are noise on a shared machine.

Most of a row's time is TensorFlow tracing train steps (every candidate, the
one-liner's own candidates, every search trial): seconds for the MLP, ResNet and GRU,
tens of seconds for the decoders and MobileNetV2, a minute or more per trace for
DenseNet121 on two shared cores. `--models`, `--no-search` and `--trials` trim it.

Run:

    python bench/oneliner.py [--models resnet,mlp] [--rounds 7] [--steps 4] [--quick]
                             [--no-search] [--float16] [--json figures.json]
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
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import autoprec  # noqa: E402

UNIFORM = ("float32", "mixed_bfloat16", "mixed_float16")
PLANS = ("one-liner", "search")
NOISE = 1.05  # ratios within ~5 % of each other are noise here
MIN_BOUND = 1.03  # the goal on the minimum: at most 1.03x of the best uniform policy
#: plan.metadata keys shown as the one-liner's and the search's own report (read defensively)
REPORT_WORDS = ("measur", "predict", "evidence", "candidate", "timing", "timed", "chose")
#: keys of plan.metadata["search"] shown besides those: where the search's time went, its checks
SEARCH_KEYS = ("stage_seconds", "wall_seconds", "fidelity_check", "confirmation")

# ---------------------------------------------------------------------- models and data


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One benchmark model: how to build it, its data, batch size and loss.

    Attributes:
        name: the `--models` name.
        kind: a few words on what it is.
        build: builds the uncompiled model (the global dtype policy applies to it).
        data: `data(rng, samples)` returns `(x, y)` NumPy arrays (x may be a dict).
        batch_size: the batch size it trains and is timed with.
        logits: whether the model outputs logits (else probabilities).
        search_baseline: the search's `SearchSettings.baseline`; `None` for models with
            BatchNormalization, whose moving statistics do not settle in a few training
            steps, so their validation loss (inference mode) is no better than the
            untrained model's at the search's fidelity although they learn.
    """

    name: str
    kind: str
    build: Callable[[], keras.Model]
    data: Callable[[np.random.Generator, int], tuple[Any, np.ndarray]]
    batch_size: int
    logits: bool = False
    search_baseline: str | None = "auto"


CLASSES = 10
VOCABULARY = 1000


def image_data(size: int) -> Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray]]:
    """Noise images with a per-class channel offset (learnable through pooling)."""

    def data(rng: np.random.Generator, samples: int):
        pattern = np.random.default_rng(1234).normal(size=(CLASSES, 1, 1, 3))
        y = rng.integers(0, CLASSES, samples).astype("int32")
        x = rng.normal(size=(samples, size, size, 3)) + 1.5 * pattern[y]
        return x.astype("float32"), y

    return data


def marker_tokens(
    length: int,
) -> Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray]]:
    """Random tokens with the class id (a token below `CLASSES`) at about a quarter of positions."""

    def data(rng: np.random.Generator, samples: int):
        y = rng.integers(0, CLASSES, samples).astype("int32")
        x = rng.integers(CLASSES, VOCABULARY, (samples, length))
        marked = rng.random((samples, length)) < 0.25
        x = np.where(marked, y[:, None], x).astype("int32")
        return x, y

    return data


def language_model_data(
    length: int,
) -> Callable[[np.random.Generator, int], tuple[dict, np.ndarray]]:
    """keras-hub decoder inputs; the target is a fixed function of the token at each position."""

    def data(rng: np.random.Generator, samples: int):
        tokens = rng.integers(1, VOCABULARY, (samples, length)).astype("int32")
        x = {"token_ids": tokens, "padding_mask": np.ones((samples, length), "int32")}
        return x, ((tokens * 7 + 3) % VOCABULARY).astype("int32")

    return data


def dense_data(features: int, classes: int):
    """Gaussian features labelled by a fixed random linear teacher on the first eight."""

    def data(rng: np.random.Generator, samples: int):
        teacher = np.random.default_rng(1234).normal(size=(8, classes))
        x = rng.normal(size=(samples, features)).astype("float32")
        return x, np.argmax(x[:, :8] @ teacher, axis=1).astype("int32")

    return data


def build_resnet() -> keras.Model:
    """A small ResNet (no depthwise convolutions): stem, three residual stages, pooling, head."""
    layers = keras.layers
    inputs = keras.Input((32, 32, 3), name="image")
    hidden = layers.Conv2D(32, 3, padding="same", name="stem")(inputs)
    hidden = layers.BatchNormalization(name="stem_bn")(hidden)
    hidden = layers.Activation("relu", name="stem_relu")(hidden)
    for index, (filters, stride) in enumerate([(32, 1), (64, 2), (128, 2)]):
        name = f"stage{index}"
        shortcut = hidden
        hidden = layers.Conv2D(filters, 3, strides=stride, padding="same", name=f"{name}_conv1")(
            hidden
        )
        hidden = layers.BatchNormalization(name=f"{name}_bn1")(hidden)
        hidden = layers.Activation("relu", name=f"{name}_relu1")(hidden)
        hidden = layers.Conv2D(filters, 3, padding="same", name=f"{name}_conv2")(hidden)
        hidden = layers.BatchNormalization(name=f"{name}_bn2")(hidden)
        if stride != 1 or shortcut.shape[-1] != filters:
            shortcut = layers.Conv2D(filters, 1, strides=stride, name=f"{name}_project")(shortcut)
        hidden = layers.Add(name=f"{name}_add")([hidden, shortcut])
        hidden = layers.Activation("relu", name=f"{name}_relu2")(hidden)
    hidden = layers.GlobalAveragePooling2D(name="pool")(hidden)
    outputs = layers.Dense(CLASSES, activation="softmax", name="head")(hidden)
    return keras.Model(inputs, outputs, name="resnet")


def build_mobilenetv2() -> keras.Model:
    """keras.applications' MobileNetV2 (depthwise convolutions), random weights, 64x64 input."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "weights for input shape (224, 224) will be loaded"
        return keras.applications.MobileNetV2(
            input_shape=(64, 64, 3), weights=None, classes=CLASSES
        )


def build_densenet121() -> keras.Model:
    """keras.applications' DenseNet121, random weights, 64x64 input."""
    return keras.applications.DenseNet121(input_shape=(64, 64, 3), weights=None, classes=CLASSES)


def build_transformer(length: int = 64, width: int = 256, heads: int = 4) -> keras.Model:
    """A two-block post-norm Transformer encoder classifier (MultiHeadAttention blocks)."""
    layers = keras.layers
    inputs = keras.Input((length,), dtype="int32", name="tokens")
    hidden = layers.Embedding(VOCABULARY, width, name="embedding")(inputs)
    for index in range(2):
        name = f"block{index}"
        attended = layers.MultiHeadAttention(heads, width // heads, name=f"{name}_attention")(
            hidden, hidden
        )
        hidden = layers.LayerNormalization(name=f"{name}_norm1")(
            layers.Add(name=f"{name}_add1")([hidden, attended])
        )
        feed = layers.Dense(width * 4, activation="gelu", name=f"{name}_ff1")(hidden)
        feed = layers.Dense(width, name=f"{name}_ff2")(feed)
        hidden = layers.LayerNormalization(name=f"{name}_norm2")(
            layers.Add(name=f"{name}_add2")([hidden, feed])
        )
    hidden = layers.GlobalAveragePooling1D(name="pool")(hidden)
    outputs = layers.Dense(CLASSES, activation="softmax", name="head")(hidden)
    return keras.Model(inputs, outputs, name="transformer")


def build_gpt2(length: int = 128) -> keras.Model:
    """keras-hub's GPT-2 causal LM, tiny configuration (2 blocks, width 256), random weights."""
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_heads=4,
        hidden_dim=256,
        intermediate_dim=1024,
        max_sequence_length=length,
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def build_llama() -> keras.Model:
    """keras-hub's Llama causal LM, tiny configuration (2 blocks, width 256), random weights."""
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=256,
        intermediate_dim=1024,
    )
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def build_gru(length: int = 64) -> keras.Model:
    """A text classifier: Embedding, two GRU(256) layers, a softmax head."""
    layers = keras.layers
    inputs = keras.Input((length,), dtype="int32", name="tokens")
    hidden = layers.Embedding(VOCABULARY, 128, name="embedding")(inputs)
    hidden = layers.GRU(256, return_sequences=True, name="gru1")(hidden)
    hidden = layers.GRU(256, name="gru2")(hidden)
    outputs = layers.Dense(CLASSES, activation="softmax", name="head")(hidden)
    return keras.Model(inputs, outputs, name="gru_text")


def build_mlp(features: int = 1024, width: int = 2048, depth: int = 4) -> keras.Model:
    """A wide MLP: `depth` Dense(`width`, relu) layers and a softmax head."""
    inputs = keras.Input((features,), name="features")
    hidden = inputs
    for index in range(depth):
        hidden = keras.layers.Dense(width, activation="relu", name=f"dense{index}")(hidden)
    outputs = keras.layers.Dense(CLASSES, activation="softmax", name="head")(hidden)
    return keras.Model(inputs, outputs, name="wide_mlp")


def build_tiny() -> keras.Model:
    """The smallest model (for the bench's own test): two Dense(64) layers and a head."""
    return build_mlp(features=32, width=64, depth=2)


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "resnet",
            "CNN, no depthwise (ResNet-style, 32x32)",
            build_resnet,
            image_data(32),
            32,
            search_baseline=None,
        ),
        ModelSpec(
            "mobilenetv2",
            "CNN, depthwise (MobileNetV2, 64x64)",
            build_mobilenetv2,
            image_data(64),
            16,
            search_baseline=None,
        ),
        ModelSpec(
            "densenet121",
            "DenseNet121 (64x64)",
            build_densenet121,
            image_data(64),
            16,
            search_baseline=None,
        ),
        ModelSpec(
            "transformer",
            "Transformer encoder (2 MHA blocks)",
            build_transformer,
            marker_tokens(64),
            32,
        ),
        ModelSpec(
            "gpt2",
            "keras-hub GPT-2 causal LM (tiny)",
            build_gpt2,
            language_model_data(128),
            16,
            True,
        ),
        ModelSpec(
            "llama",
            "keras-hub Llama causal LM (tiny)",
            build_llama,
            language_model_data(128),
            16,
            True,
        ),
        ModelSpec("gru", "recurrent (2x GRU(256) text)", build_gru, marker_tokens(64), 32),
        ModelSpec("mlp", "wide MLP (4x Dense(2048))", build_mlp, dense_data(1024, CLASSES), 32),
    )
}
#: Not in the default list: the smallest model, for the bench's own test.
EXTRA_MODELS = {
    "tiny": ModelSpec("tiny", "tiny MLP (2x Dense(64))", build_tiny, dense_data(32, CLASSES), 16)
}
QUICK_MODELS = ("resnet", "mlp")


# ---------------------------------------------------------------------- building candidates


@contextlib.contextmanager
def global_policy(name: str) -> Iterator[None]:
    """Builds under Keras' global dtype policy `name`; the previous policy comes back after."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def build_copy(spec: ModelSpec, weights: list | None, policy: str = "float32") -> keras.Model:
    """A compiled copy of `spec`'s model under Keras' global `policy`, with `weights` if given."""
    with global_policy(policy):
        keras.utils.set_random_seed(0)
        model = spec.build()
        if weights is not None:
            model.set_weights(weights)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=spec.logits),
        )
    return model


def first(x: Any, count: int) -> Any:
    """The first `count` samples of arrays or of a dict of arrays."""
    if isinstance(x, dict):
        return {key: value[:count] for key, value in x.items()}
    return x[:count]


def composition(plan: autoprec.PrecisionPlan) -> dict[str, int]:
    """Layers of a plan per compute dtype."""
    return dict(sorted(collections.Counter(plan.layers.values()).items()))


def plan_report(metadata: dict[str, Any]) -> dict[str, Any]:
    """The figures a plan records about what was measured, predicted and chosen.

    Every top-level key naming a measurement, prediction, evidence or candidate, and the
    same keys of `metadata["search"]`; the per-layer evidence is summarised as layers
    per reason (its full text stays in the plan).
    """
    report: dict[str, Any] = {}
    sources = [("", metadata)]
    if isinstance(metadata.get("search"), dict):
        sources.append(("search.", metadata["search"]))
    for prefix, source in sources:
        for key, value in source.items():
            wanted = any(word in key.lower() for word in REPORT_WORDS)
            if not (wanted or (prefix and key in SEARCH_KEYS)) or value is None:
                continue
            if key == "evidence" and isinstance(value, dict):
                value = evidence_summary(value)
            report[prefix + key] = value
    return report


def evidence_summary(evidence: dict[str, Any]) -> dict[str, Any]:
    """Per-layer evidence in a few figures: layers per reason, per allowed dtypes, summed seconds."""
    entries = [entry for entry in evidence.values() if isinstance(entry, dict)]
    summary: dict[str, Any] = {"layers": len(evidence)}
    reasons = collections.Counter(str(entry["reason"]) for entry in entries if "reason" in entry)
    if reasons:
        summary["per_reason"] = dict(reasons.most_common())
    allowed = collections.Counter(
        "/".join(entry["allowed"]) for entry in entries if isinstance(entry.get("allowed"), list)
    )
    if allowed:
        summary["per_allowed"] = dict(allowed.most_common())
    seconds: dict[str, float] = collections.defaultdict(float)
    for entry in entries:
        for dtype, value in (entry.get("seconds") or {}).items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                seconds[dtype] += value
    if seconds:
        summary["summed_layer_ms"] = {
            dtype: round(value * 1e3, 3) for dtype, value in seconds.items()
        }
    return summary


class MessageCapture(logging.Handler):
    """Keeps the lines autoprec shows (its `"autoprec"` logger) while installed."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def captured_messages() -> Iterator[MessageCapture]:
    """Routes autoprec's shown lines to a `MessageCapture` (Keras' interactive logging off)."""
    logger = logging.getLogger("autoprec")
    handler, level, interactive = (
        MessageCapture(),
        logger.level,
        keras.config.is_interactive_logging_enabled(),
    )
    keras.config.disable_interactive_logging()
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # shown once, by this bench, not by a root handler as well
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
        if interactive:
            keras.config.enable_interactive_logging()


def timed_fit(model: keras.Model, x, y, batch_size: int, callbacks: list) -> float:
    """Seconds of one epoch of `fit` (no shuffling, silent)."""
    started = time.perf_counter()
    model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return time.perf_counter() - started


# ---------------------------------------------------------------------- timing


def time_interleaved(
    steps: dict[str, Callable[[], None]], rounds: int, steps_per_round: int
) -> dict[str, list[float]]:
    """Mean seconds per step of each function, per round, in rounds whose order rotates.

    Each function first runs `steps_per_round` untimed steps (the warm-up, which also traces).
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


def train_step(model: keras.Model, x, y) -> Callable[[], None]:
    """One `train_on_batch` on the fixed batch, synchronised by reading the loss."""

    def step() -> None:
        logs = model.train_on_batch(x, y, return_dict=True)
        float(logs["loss"])

    return step


# ---------------------------------------------------------------------- one model


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every model's row runs with."""

    rounds: int
    steps: int
    epoch_steps: int
    search: bool
    trials: int
    trial_steps: int
    float16: bool


def run_model(spec: ModelSpec, settings: Settings) -> dict[str, Any]:
    """Builds, decides, times and compares every candidate of one model; its row of figures."""
    started = time.perf_counter()
    row: dict[str, Any] = {"kind": spec.kind, "batch_size": spec.batch_size, "errors": {}}
    batch = spec.batch_size
    x, y = spec.data(np.random.default_rng(0), batch * settings.epoch_steps)
    x_val, y_val = spec.data(np.random.default_rng(1), batch * 4)
    x_batch, y_batch = first(x, batch), first(y, batch)

    stages: dict[str, float] = {}
    clock = time.perf_counter()
    reference = build_copy(spec, None)
    weights = reference.get_weights()
    row["parameters"] = int(reference.count_params())
    models: dict[str, keras.Model] = {"float32": reference}
    stages["build"], clock = time.perf_counter() - clock, time.perf_counter()

    # The fit without autoprec runs on the float32 candidate itself: its traced train
    # function is the one `train_on_batch` reuses below, so TensorFlow traces it once.
    row["fit_plain_s"] = timed_fit(reference, x, y, batch, [])
    reference.set_weights(weights)

    plans: dict[str, autoprec.PrecisionPlan] = {}
    copy = build_copy(spec, weights)
    callback = autoprec.AutoPrecision(hardware="local")
    try:
        with captured_messages() as messages:
            row["fit_autoprecision_s"] = timed_fit(copy, x, y, batch, [callback])
        plans["one-liner"] = callback.plan
        row["one_liner_added_s"] = row["fit_autoprecision_s"] - row["fit_plain_s"]
        row["one_liner_messages"] = messages.lines
    except Exception as error:  # a failing candidate is reported, the others still run
        row["errors"]["one-liner"] = f"{type(error).__name__}: {error}"
    del copy, callback
    stages["fits"], clock = time.perf_counter() - clock, time.perf_counter()

    if settings.search:
        try:
            result = autoprec.search(
                reference,
                (x, y),
                validation_data=(x_val, y_val),
                budget=autoprec.Budget("val_loss", max_relative_drop=0.05),
                hardware="local",
                n_trials=settings.trials,
                verbose=0,
                settings=autoprec.SearchSettings(
                    batch_size=batch,
                    steps_per_trial=settings.trial_steps,
                    seed=0,
                    baseline=spec.search_baseline,
                ),
            )
            plans["search"] = result.plan
        except Exception as error:
            row["errors"]["search"] = f"{type(error).__name__}: {error}"
        reference.set_weights(weights)
        row["search_s"] = stages["search"] = time.perf_counter() - clock
        clock = time.perf_counter()

    for policy in UNIFORM[1:]:
        if policy == "mixed_float16" and not settings.float16:
            continue
        models[policy] = build_copy(spec, weights, policy)
    for name, plan in plans.items():
        model = build_copy(spec, weights)
        try:
            autoprec.apply_plan(model, plan, x=x_batch)
        except Exception as error:
            row["errors"][name] = f"apply_plan: {type(error).__name__}: {error}"
            continue
        models[name] = model
    row["plans"] = {
        name: {"composition": composition(plan), "report": plan_report(dict(plan.metadata))}
        for name, plan in plans.items()
    }
    stages["candidates"], clock = time.perf_counter() - clock, time.perf_counter()

    steps = {name: train_step(model, x_batch, y_batch) for name, model in models.items()}
    samples = time_interleaved(steps, settings.rounds, settings.steps)
    row["candidates"] = {
        name: {
            "ms_min": min(values) * 1e3,
            "ms_median": statistics.median(values) * 1e3,
            "rounds_ms": [value * 1e3 for value in values],
        }
        for name, values in samples.items()
    }
    wanted = PLANS if settings.search else PLANS[:1]
    row.update(compare(row["candidates"], wanted))
    stages["timing"] = time.perf_counter() - clock
    row["stage_s"] = stages
    row["wall_s"] = time.perf_counter() - started
    del models, steps
    gc.collect()
    return row


def compare(candidates: dict[str, dict[str, float]], wanted: tuple[str, ...]) -> dict[str, Any]:
    """Best uniform policy (by min and by median), each plan's ratio to it, and the verdicts.

    A plan in `wanted` without figures (it failed) is an `ERROR`; one not wanted is `n/a`.
    """
    uniform = {name: figures for name, figures in candidates.items() if name in UNIFORM}
    best = {
        statistic: min(uniform, key=lambda name: uniform[name][f"ms_{statistic}"])
        for statistic in ("min", "median")
    }
    ratios, verdicts = {}, {}
    for name in PLANS:
        if name not in candidates:
            verdicts[name] = "ERROR" if name in wanted else "n/a"
            continue
        ratios[name] = {
            statistic: candidates[name][f"ms_{statistic}"]
            / uniform[best[statistic]][f"ms_{statistic}"]
            for statistic in ("min", "median")
        }
        verdicts[name] = "PASS" if ratios[name]["min"] <= MIN_BOUND else "FAIL"
    sixteen = [name for name in uniform if name != "float32"]
    fastest_16 = min(sixteen, key=lambda name: uniform[name]["ms_min"]) if sixteen else None
    pays = bool(fastest_16 and uniform[fastest_16]["ms_min"] * NOISE < uniform["float32"]["ms_min"])
    return {"best_uniform": best, "ratios": ratios, "verdicts": verdicts, "sixteen_bit_pays": pays}


# ---------------------------------------------------------------------- summary and printing


def geometric_mean(values: list[float]) -> float | None:
    return math.exp(statistics.fmean(math.log(value) for value in values)) if values else None


def summarise(rows: dict[str, dict]) -> dict[str, Any]:
    """Geometric means of each plan's ratios, over all models and where 16-bit pays; the goal."""
    summary: dict[str, Any] = {"geomean": {}, "geomean_where_16bit_pays": {}}
    paying = [name for name, row in rows.items() if row.get("sixteen_bit_pays")]
    for plan in PLANS:
        for key, names in (("geomean", list(rows)), ("geomean_where_16bit_pays", paying)):
            summary[key][plan] = {
                statistic: geometric_mean(
                    [
                        rows[name]["ratios"][plan][statistic]
                        for name in names
                        if plan in rows[name].get("ratios", {})
                    ]
                )
                for statistic in ("min", "median")
            }
    summary["models_where_16bit_pays"] = paying
    goal = {}
    for plan in PLANS:
        verdicts = [row.get("verdicts", {}).get(plan, "ERROR") for row in rows.values()]
        if all(verdict == "n/a" for verdict in verdicts):
            continue
        mean = summary["geomean_where_16bit_pays"][plan]["min"]
        goal[plan] = {
            "models_pass": all(verdict == "PASS" for verdict in verdicts),
            "geomean_below_1": None if not paying or mean is None else mean < 1.0,
        }
        goal[plan]["pass"] = (
            goal[plan]["models_pass"] and goal[plan]["geomean_below_1"] is not False
        )
    summary["goal"] = goal
    return summary


def host_description() -> dict[str, Any]:
    """The CPU's model name and its 16-bit flags (`lscpu`), core count, frameworks."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        text = ""
    model, flags = platform.processor() or platform.machine(), set()
    for line in text.splitlines():
        if line.lower().startswith("model name"):
            model = line.split(":", 1)[1].strip()
        elif line.lower().startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
    sixteen = sorted(
        flag for flag in flags if flag in ("avx512_bf16", "avx512_fp16") or flag.startswith("amx")
    )
    import tensorflow as tf

    return {
        "cpu": model,
        "flags": sixteen,
        "cores": os.cpu_count(),
        "gpus": [device.name for device in tf.config.list_physical_devices("GPU")],
        "keras": keras.__version__,
        "tensorflow": tf.__version__,
        "autoprec": autoprec.__version__,
    }


def short(value: Any, width: int = 160) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= width else text[: width - 3] + "..."


def print_model(name: str, row: dict[str, Any]) -> None:
    print(
        f"\n== {name}: {row['kind']}, {row.get('parameters', 0):,} parameters, batch {row['batch_size']}"
    )
    if row.get("candidates"):
        print(f"  {'candidate':<15} {'ms min':>8} {'median':>8}   {'/ best uniform min, median'}")
    for candidate, figures in row.get("candidates", {}).items():
        ratio = row["ratios"].get(candidate)
        text = f"  {candidate:<15} {figures['ms_min']:8.1f} {figures['ms_median']:8.1f}"
        if ratio:
            text += f"   {ratio['min']:6.3f}x {ratio['median']:6.3f}x"
        print(text)
    if "best_uniform" in row:
        best = row["best_uniform"]
        print(
            f"  best uniform: {best['min']} (min), {best['median']} (median); "
            f"16-bit pays here: {'yes' if row['sixteen_bit_pays'] else 'no'}"
        )
    for plan, info in row.get("plans", {}).items():
        print(
            f"  {plan} plan: "
            + ", ".join(f"{count} {dtype}" for dtype, count in info["composition"].items())
        )
        for key, value in info["report"].items():
            if isinstance(value, dict) and len(short(value)) > 120:
                for inner, item in value.items():
                    if "rounds" not in inner:  # the per-round figures stay in the JSON
                        print(f"    {key}.{inner}: {short(item)}")
            else:
                print(f"    {key}: {short(value)}")
    if row.get("one_liner_messages"):
        print("  what the one-liner showed (verbose=1):")
    for line in row.get("one_liner_messages", []):
        print(f"    | {line}")
    if "one_liner_added_s" in row:
        print(
            f"  one-liner added {row['one_liner_added_s']:.1f} s to the first epoch "
            f"({row['fit_autoprecision_s']:.1f} s with AutoPrecision, {row['fit_plain_s']:.1f} s without)"
        )
    if "search_s" in row:
        print(f"  search: {row['search_s']:.1f} s")
    for candidate, error in row.get("errors", {}).items():
        print(f"  ERROR {candidate}: {short(error, 400)}")
    for plan, verdict in row.get("verdicts", {}).items():
        ratio = row.get("ratios", {}).get(plan)
        figures = f" ({ratio['min']:.3f}x min, {ratio['median']:.3f}x median)" if ratio else ""
        print(f"  {verdict} {plan}{figures}")
    stages = ", ".join(
        f"{stage} {seconds:.0f}" for stage, seconds in row.get("stage_s", {}).items()
    )
    print(f"  ({row.get('wall_s', 0):.0f} s: {stages})")


def print_summary(rows: dict[str, dict], summary: dict[str, Any]) -> None:
    print("\n== summary: ratio to the best uniform policy, min / median over rounds")
    print(f"  {'model':<12} {'one-liner':>17} {'search':>17}  16-bit pays  verdicts")
    for name, row in rows.items():
        cells = []
        for plan in PLANS:
            ratio = row.get("ratios", {}).get(plan)
            cells.append(f"{ratio['min']:.3f}/{ratio['median']:.3f}" if ratio else "-")
        verdicts = " ".join(
            f"{plan}:{verdict}" for plan, verdict in row.get("verdicts", {}).items()
        )
        pays = "yes" if row.get("sixteen_bit_pays") else "no"
        print(f"  {name:<12} {cells[0]:>17} {cells[1]:>17}  {pays:<11}  {verdicts}")
    for key, label in (
        ("geomean", "all models"),
        ("geomean_where_16bit_pays", "where 16-bit pays"),
    ):
        cells = []
        for plan in PLANS:
            mean = summary[key][plan]
            cells.append("-" if mean["min"] is None else f"{mean['min']:.3f}/{mean['median']:.3f}")
        print(f"  {'geomean':<12} {cells[0]:>17} {cells[1]:>17}  ({label})")
    print(
        f"  goal: every model at most {MIN_BOUND:.2f}x on the minimum; geometric mean (min) below "
        "1.00x over the models where 16-bit pays (a uniform 16-bit policy >5 % faster than float32)"
    )
    for plan, goal in summary["goal"].items():
        mean = summary["geomean_where_16bit_pays"][plan]["min"]
        below = (
            "n/a (16-bit pays on no model)"
            if goal["geomean_below_1"] is None
            else (f"{mean:.3f}x {'<' if goal['geomean_below_1'] else '>='} 1.00")
        )
        print(
            f"  {'PASS' if goal['pass'] else 'FAIL'} {plan}: models "
            f"{'all pass' if goal['models_pass'] else 'not all pass'}; geomean where 16-bit pays {below}"
        )


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
    parser.add_argument("--models", help=f"comma-separated, of {', '.join(MODELS)} (default all)")
    parser.add_argument(
        "--rounds", type=int, help="interleaved timed rounds (default 7; at least 5 to judge)"
    )
    parser.add_argument(
        "--steps", type=int, default=4, help="train steps per round, and of the warm-up"
    )
    parser.add_argument(
        "--epoch-steps",
        type=int,
        default=48,
        help="steps of the one-liner's first epoch (it profiles 20 and times its candidates in 20)",
    )
    parser.add_argument("--trials", type=int, help="search trials (default 6; 2 with --quick)")
    parser.add_argument(
        "--trial-steps", type=int, help="training steps of each search trial (default 10; 5 quick)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{' and '.join(QUICK_MODELS)}, 3 rounds, a 2-trial search (a few minutes)",
    )
    parser.add_argument("--no-search", action="store_true", help="skip autoprec.search")
    parser.add_argument(
        "--float16", action="store_true", help="also time mixed_float16 (slow on a CPU)"
    )
    parser.add_argument("--cache-dir", help="autoprec's cost cache (default: a fresh, empty one)")
    parser.add_argument("--json", help="write the figures there (atomically)")
    return parser.parse_args(argv)


def run_all(names, known, settings, report, json_path) -> dict[str, dict]:
    """Runs each model's row in turn, printing it and rewriting the JSON after each."""
    for name in names:
        try:
            row = run_model(known[name], settings)
        except Exception as error:  # one broken model does not stop the others
            row = {
                "kind": known[name].kind,
                "batch_size": known[name].batch_size,
                "errors": {"model": f"{type(error).__name__}: {error}"},
                "verdicts": {plan: "ERROR" for plan in (PLANS if settings.search else PLANS[:1])},
            }
        report["models"][name] = row
        print_model(name, row)
        sys.stdout.flush()
        if json_path:
            write_json(json_path, report)
    return report["models"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark; prints the tables and returns (and optionally writes) the figures."""
    args = parse(argv)
    names = args.models.split(",") if args.models else list(QUICK_MODELS if args.quick else MODELS)
    known = {**MODELS, **EXTRA_MODELS}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"oneliner.py: unknown --models {unknown}; choose from {', '.join(known)}")
    rounds = args.rounds or (3 if args.quick else 7)
    float16 = args.float16 or autoprec.hardware.detect().is_fast("float16")
    settings = Settings(
        rounds=rounds,
        steps=args.steps,
        epoch_steps=args.epoch_steps,
        search=not args.no_search,
        trials=args.trials or (2 if args.quick else 6),
        trial_steps=args.trial_steps or (5 if args.quick else 10),
        float16=float16,
    )
    cache = (
        contextlib.nullcontext(args.cache_dir) if args.cache_dir else tempfile.TemporaryDirectory()
    )
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.perf_counter()
    host = host_description()
    print(
        f"host: {host['cpu']} ({host['cores']} CPU cores; 16-bit flags: {', '.join(host['flags']) or 'none'}"
        f"{'; GPUs: ' + ', '.join(host['gpus']) if host['gpus'] else ''}), Keras {host['keras']}, "
        f"TF {host['tensorflow']}, autoprec {host['autoprec']}"
    )
    print(
        f"settings: {rounds} interleaved rounds x {settings.steps} steps after {settings.steps} warm-up "
        f"steps; one-liner epoch {settings.epoch_steps} steps; search "
        + (f"{settings.trials} trials x {settings.trial_steps} steps" if settings.search else "off")
        + f"; mixed_float16 {'timed' if float16 else 'not timed (slow here; --float16 to time it)'}"
        + ("" if rounds >= 5 else "; fewer than 5 rounds: figures not conclusive")
    )
    report: dict[str, Any] = {"host": host, "settings": dataclasses.asdict(settings), "models": {}}
    previous_cache = os.environ.get("AUTOPREC_CACHE_DIR")
    with cache as cache_dir:
        os.environ["AUTOPREC_CACHE_DIR"] = str(cache_dir)
        try:
            rows = run_all(names, known, settings, report, args.json)
        finally:
            if previous_cache is None:
                os.environ.pop("AUTOPREC_CACHE_DIR", None)
            else:
                os.environ["AUTOPREC_CACHE_DIR"] = previous_cache
    del rows
    timed = report["models"]
    report["summary"] = summarise(timed)
    report["wall_s"] = time.perf_counter() - started
    print_summary(timed, report["summary"])
    print(f"({report['wall_s']:.0f} s; ratios within ~5 % are noise on a shared machine)")
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
