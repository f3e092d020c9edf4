"""Keras' uniform policies, the one-liner's plan and the searched plan on one GPU, with JAX.

Measures, side by side in one process on the JAX backend, the whole train step, the
peak memory and the largest batch that fits of each candidate, on three models built
here (nothing downloaded; data generated with fixed seeds):

- `transformer`: a BERT-style Transformer encoder classifier (post-norm blocks of
  `MultiHeadAttention` with attention dropout 0.1, feed-forward, pooling, head);
- `gpt`: a GPT-style decoder language model (pre-norm blocks of causal
  `MultiHeadAttention` with dropout 0.1 and a logits head over the vocabulary; no
  position embeddings, the causal mask orders the tokens). Keras layers only, so
  it needs no keras-hub on the GPU machine;
- `resnet`: a ResNet-style CNN (stem, four stages of residual blocks with
  BatchNormalization and projections, pooling, head).

The candidates of each model:

- `float32`, `mixed_bfloat16`, `mixed_float16`: the model built under
  `keras.config.set_dtype_policy(...)` (restored after), exactly as Keras applies
  the policy; `compile` under `mixed_float16` wraps the optimizer in Keras'
  `LossScaleOptimizer`, as Keras does;
- `one-liner`: `model.fit(...)` for one short epoch with `autoprec.AutoPrecision()`
  on a float32 copy (costs measured on the device, `hardware="local"`; it times its
  candidates' whole step inside fit, recorded in `plan.metadata["measured"]`, read
  defensively); its `callback.plan` applied to a fresh copy with `autoprec.apply_plan`;
- `search`: `autoprec.search(model, train, validation_data=val,
  budget=autoprec.Budget("val_loss", max_relative_drop=0.05), hardware="local",
  n_trials=2)`; its `result.plan` applied to a fresh copy likewise.

Every candidate starts from the same initial weights, optimizer (Adam) and loss; a
plan with float16 layers is compiled with Keras' `LossScaleOptimizer`, as Keras
compiles `mixed_float16`.

Step time: the whole train step (`train_on_batch` on one fixed, device-resident
batch, synchronised by reading the loss) of all candidates of a model, in
interleaved rounds whose order rotates (7 rounds of 10 steps), after a warm-up of as
many steps as a round. Each round's figure is its mean step time; the table gives
the minimum and the median over rounds, and the ratio of the one-liner's plan and of
the searched plan to the best uniform policy (by minimum and by median).

Memory, in a second process started at the end (the device's high-water mark starts
fresh there, and running out of memory cannot harm the timing process): each
candidate's train step (`jax.jit(model.train_step, donate_argnums=0)`, the function
Keras compiles) is compiled at the timed batch size; XLA's buffer assignment gives
its bytes (`xla_bytes`: arguments + outputs + temporaries - aliased; every backend).
The steps then run once each in ascending order of those bytes, so each raises the
high-water mark: `peak_bytes_in_use` is `jax.devices()[0].memory_stats()
["peak_bytes_in_use"]` after the step, `step_bytes` what the step added to the memory
in use before it, `peak_bytes` the candidate's own peak (its variables plus
`step_bytes`). The largest batch that fits: doubling from a first batch predicted
from `step_bytes` and the free memory (else from twice the timed batch) until a step
runs out of memory (RESOURCE_EXHAUSTED) or reaches the cap (64x the timed batch),
then three bisection steps between the last fit and the first failure;
`max_batch_bound` says what ended it (`"oom"`, `"cap"` or `"time"`), and every probe
is recorded. Where the backend keeps no memory statistics (a CPU), the runtime
figures are `None` and the batch search stops at its cap.

Attention overflow check: an attention model whose q·k logits overflow float16
(> 65504) while every layer output stays modest. Uniform `mixed_float16` must go
non-finite; the one-liner's plan (decided by `AutoPrecision()` on that model, then
trained through `AutoPrecision(plan)`, guard on) must train finitely. Keras' fused
`dot_product_attention` on JAX computes logits in float32 whatever the policy, so
q·k only overflows on MultiHeadAttention's explicit path, which it takes whenever
attention dropout is set (the usual `dropout=0.1` of BERT-style encoders): every
attention model here sets it.

Each stage (build, one-liner, search, candidates, timing; the overflow check; the
memory process) is recorded with its seconds; one that fails is recorded with its
error and traceback tail, and the run goes on. Time: `--budget-seconds` (400 by
default) is shared out, 130 s kept for the overflow check and the memory process and
each model getting an equal share of the rest; the search gets a `timeout` of 45 %
of what is left of its model's share, a stage that would start after its model's
share is skipped (recorded), the largest-batch probes share the memory process's
time (`"time"` where they ran out), and the memory process is stopped 50 s after the
budget (what it wrote is kept): about 8 minutes with the install, within the run's
540 s. JAX's persistent compilation cache is on (a fresh
folder unless `JAX_COMPILATION_CACHE_DIR` is set): the same programs, compiled again
for each copy, compile once. Results go to `results.json` under `--out` (default
`$OUT`), rewritten atomically after every stage of the run; the table is printed last.

Prepare (on the CPU machine, in the repository root; the GPU machine has Python 3.12
and JAX with CUDA, numpy, h5py, ml-dtypes, rich, PyYAML, tqdm, packaging and absl-py,
but no TensorFlow, keras, optuna or autoprec, and no network): autoprec's own wheel,
then the two dependencies of Keras it lacks (namex, optree) and Keras, then Optuna and its
dependencies (alembic, SQLAlchemy, colorlog, Mako, MarkupSafe, greenlet,
typing_extensions):

    echo /.whl/ >> .git/info/exclude
    python3 -m pip wheel --no-deps -w .whl .
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \\
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
        --platform manylinux1_x86_64 -d .whl \\
        keras==3.15.1 namex optree optuna==5.0.0 alembic sqlalchemy colorlog Mako \\
        MarkupSafe greenlet typing_extensions

Run (device tool `run`, carry `[".whl"]`, timeout_s 540):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; \\
    PYTHONUNBUFFERED=1 KERAS_BACKEND=jax python3 bench/gpu.py --out $OUT

Smoke run on a CPU (small stand-in models, 2 rounds of 1 step, cap 2x; costs
predicted for the RTX 2060 profile rather than measured, which gives the decoder and
the CNN plans with float16 layers; `--measure-here` measures them as the GPU run
does, several times slower):

    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python bench/gpu.py --smoke --out /tmp/bench
"""

from __future__ import annotations

import argparse
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
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # XLA's info lines would fill the output
# Memory on demand: the memory process shares the device with this one.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
if "--smoke" in sys.argv or "--smoke-child" in sys.argv:
    # Tiny models on a CPU: compile fast rather than run fast.
    os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
if os.environ.get("BENCH_GPU_BLOCK_TENSORFLOW") == "1":
    sys.modules["tensorflow"] = None  # as on the GPU machine: TensorFlow cannot be imported

warnings.filterwarnings("ignore", message="Explicitly requested dtype int64")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import autoprec  # noqa: E402
from autoprec.search import output_layers  # noqa: E402

UNIFORM = ("float32", "mixed_bfloat16", "mixed_float16")
#: `"float8"`: float8 on every Dense/EinsumDense layer but the output layers, bfloat16
#: elsewhere (`float8_from_mixed_bfloat16`), timed against the uniform policies.
PLANS = ("one-liner", "search", "float8")
CANDIDATES = UNIFORM + PLANS
STATISTICS = ("min", "median")
FLOAT16_MAX = 65504.0
#: Words of `plan.metadata` keys kept as the plan's own report.
REPORT_WORDS = ("measur", "predict", "candidate", "timing", "timed", "chose", "winner")
#: Seconds kept aside for the attention-overflow check and for the memory process
#: (by smoke run or not); the models share the rest.
OVERFLOW_RESERVE = {True: 10.0, False: 30.0}
MEMORY_RESERVE = {True: 15.0, False: 100.0}
#: Seconds past the budget after which the memory process is stopped.
HARD_END_SECONDS = 50.0

# ---------------------------------------------------------------------- settings


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much the run measures: the full GPU run or the CPU smoke run.

    Attributes:
        smoke: tiny stand-in models for a CPU.
        rounds: interleaved timed rounds.
        steps: train steps per round, and of the warm-up.
        epoch_steps: steps of the one-liner's epoch.
        auto: `AutoPrecision(auto=...)` of the one-liner (`None`: its defaults).
        trials: search trials.
        trial_steps: training steps of each search trial.
        confirm_steps: the search's `SearchSettings.confirm_steps` (`None`: its default).
        cap_factor: the largest batch probed, as a multiple of the timed batch.
        bisection_steps: bisection steps after the first out-of-memory batch.
        overflow_steps: training steps of each candidate of the overflow check.
        measured_models: models whose one-liner and search measure costs here
            (`hardware="local"`); the others predict them for `predicted_hardware`
            (the smoke run: a CPU measures slowly, and the RTX 2060 profile gives
            plans with float16 layers to apply, time and measure).
        predicted_hardware: the hardware profile of the other models and of the
            overflow check's one-liner.
    """

    smoke: bool
    rounds: int
    steps: int
    epoch_steps: int
    auto: autoprec.AutoPlan | None
    trials: int
    trial_steps: int
    confirm_steps: int | None
    cap_factor: int
    bisection_steps: int
    overflow_steps: int
    measured_models: tuple[str, ...] | None = None
    predicted_hardware: str = "rtx2060"

    def hardware(self, model: str) -> str:
        """The `hardware=` of the one-liner and the search of `model`."""
        if self.measured_models is None or model in self.measured_models:
            return "local"
        return self.predicted_hardware


def settings_for(smoke: bool) -> Settings:
    """Returns the settings of the smoke run or of the full GPU run."""
    if smoke:
        return Settings(
            smoke=True,
            rounds=2,
            steps=1,
            epoch_steps=8,
            auto=autoprec.AutoPlan(profile_steps=2, timing_rounds=1),
            trials=1,
            trial_steps=3,
            confirm_steps=0,
            cap_factor=2,
            bisection_steps=1,
            overflow_steps=3,
            measured_models=(),
        )
    return Settings(
        smoke=False,
        rounds=7,
        steps=10,
        epoch_steps=96,
        auto=None,
        trials=2,
        trial_steps=10,
        confirm_steps=0,
        cap_factor=64,
        bisection_steps=3,
        overflow_steps=20,
    )


# ---------------------------------------------------------------------- models and data


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark model: how to build it, its data and loss.

    Attributes:
        name: the `--models` name.
        kind: a few words on what it is.
        build: builds the uncompiled model (the global dtype policy applies to it).
        data: `data(seed, samples)` returns `(x, y)` NumPy arrays.
        batch_size: the batch size it trains, is timed and is measured with.
        logits: whether the model outputs logits (else probabilities); `None` for
            a regression (mean squared error).
        search_baseline: the search's `SearchSettings.baseline`; `None` for models
            with BatchNormalization, whose moving statistics do not settle in a few
            steps, so their validation loss is no better than the untrained model's
            at the search's fidelity although they learn.
    """

    name: str
    kind: str
    build: Callable[[], keras.Model]
    data: Callable[[int, int], tuple[np.ndarray, np.ndarray]]
    batch_size: int
    logits: bool | None = False
    search_baseline: str | None = "auto"

    def loss(self) -> keras.losses.Loss:
        """A fresh instance of the workload's loss."""
        if self.logits is None:
            return keras.losses.MeanSquaredError()
        return keras.losses.SparseCategoricalCrossentropy(from_logits=self.logits)


CLASSES = 10


def marker_tokens(length: int, vocabulary: int):
    """Random tokens with the class id (a token below `CLASSES`) at about a quarter of positions."""

    def data(seed: int, samples: int):
        rng = np.random.default_rng(seed)
        y = rng.integers(0, CLASSES, samples).astype("int32")
        x = rng.integers(CLASSES, vocabulary, (samples, length))
        x = np.where(rng.random((samples, length)) < 0.25, y[:, None], x).astype("int32")
        return x, y

    return data


def language_tokens(length: int, vocabulary: int):
    """Random tokens; the target at each position is a fixed function of its token."""

    def data(seed: int, samples: int):
        x = np.random.default_rng(seed).integers(1, vocabulary, (samples, length)).astype("int32")
        return x, ((x * 7 + 3) % vocabulary).astype("int32")

    return data


def images(size: int):
    """Noise images with a per-class channel offset (learnable through pooling)."""

    def data(seed: int, samples: int):
        rng = np.random.default_rng(seed)
        pattern = np.random.default_rng(1234).normal(size=(CLASSES, 1, 1, 3))
        y = rng.integers(0, CLASSES, samples).astype("int32")
        x = rng.normal(size=(samples, size, size, 3)) + 1.5 * pattern[y]
        return x.astype("float32"), y

    return data


def build_encoder(
    length: int, vocabulary: int, width: int, heads: int, hidden: int, blocks: int
) -> keras.Model:
    """A BERT-style post-norm Transformer encoder classifier (attention dropout 0.1)."""
    layers = keras.layers
    tokens = keras.Input((length,), dtype="int32", name="tokens")
    x = layers.Embedding(vocabulary, width, name="embedding")(tokens)
    for index in range(blocks):
        name = f"block{index}"
        attended = layers.MultiHeadAttention(
            heads, width // heads, dropout=0.1, name=f"{name}_attention"
        )(x, x)
        x = layers.LayerNormalization(name=f"{name}_norm1")(
            layers.Add(name=f"{name}_add1")([x, attended])
        )
        forward = layers.Dense(hidden, activation="gelu", name=f"{name}_ffn1")(x)
        forward = layers.Dense(width, name=f"{name}_ffn2")(forward)
        x = layers.LayerNormalization(name=f"{name}_norm2")(
            layers.Add(name=f"{name}_add2")([x, forward])
        )
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    outputs = layers.Dense(CLASSES, activation="softmax", name="head")(x)
    return keras.Model(tokens, outputs, name="transformer_encoder")


def build_decoder(
    length: int, vocabulary: int, width: int, heads: int, hidden: int, blocks: int
) -> keras.Model:
    """A GPT-style pre-norm decoder (causal attention, dropout 0.1) with a logits head."""
    layers = keras.layers
    tokens = keras.Input((length,), dtype="int32", name="tokens")
    x = layers.Embedding(vocabulary, width, name="token_embedding")(tokens)
    for index in range(blocks):
        name = f"block{index}"
        normed = layers.LayerNormalization(epsilon=1e-5, name=f"{name}_norm1")(x)
        attended = layers.MultiHeadAttention(
            heads, width // heads, dropout=0.1, name=f"{name}_attention"
        )(normed, normed, use_causal_mask=True)
        x = layers.Add(name=f"{name}_add1")([x, attended])
        normed = layers.LayerNormalization(epsilon=1e-5, name=f"{name}_norm2")(x)
        forward = layers.Dense(hidden, activation="gelu", name=f"{name}_mlp1")(normed)
        forward = layers.Dense(width, name=f"{name}_mlp2")(forward)
        x = layers.Add(name=f"{name}_add2")([x, forward])
    x = layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    logits = layers.Dense(vocabulary, name="lm_head")(x)
    return keras.Model(tokens, logits, name="gpt_decoder")


def build_resnet(size: int, widths: tuple[int, ...]) -> keras.Model:
    """A ResNet-style CNN: stem, one residual block per stage (stride 2 after the first)."""
    layers = keras.layers
    inputs = keras.Input((size, size, 3), name="image")
    x = layers.Conv2D(widths[0], 3, padding="same", use_bias=False, name="stem")(inputs)
    x = layers.BatchNormalization(name="stem_bn")(x)
    x = layers.Activation("relu", name="stem_relu")(x)
    for index, filters in enumerate(widths):
        name, stride = f"stage{index}", 1 if index == 0 else 2
        shortcut = x
        x = layers.Conv2D(
            filters, 3, strides=stride, padding="same", use_bias=False, name=f"{name}_conv1"
        )(x)
        x = layers.BatchNormalization(name=f"{name}_bn1")(x)
        x = layers.Activation("relu", name=f"{name}_relu1")(x)
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv2")(x)
        x = layers.BatchNormalization(name=f"{name}_bn2")(x)
        if stride != 1 or shortcut.shape[-1] != filters:
            shortcut = layers.Conv2D(
                filters, 1, strides=stride, use_bias=False, name=f"{name}_project"
            )(shortcut)
            shortcut = layers.BatchNormalization(name=f"{name}_project_bn")(shortcut)
        x = layers.Add(name=f"{name}_add")([x, shortcut])
        x = layers.Activation("relu", name=f"{name}_relu2")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = layers.Dense(CLASSES, activation="softmax", name="head")(x)
    return keras.Model(inputs, outputs, name="resnet")


def workloads(smoke: bool) -> dict[str, Workload]:
    """The benchmark's three models, at GPU size or as small CPU stand-ins.

    The smoke run's decoder and CNN are just large enough for the predicted RTX 2060
    profile to give them float16 layers (a plan with loss scaling to apply and time).
    """
    # (sequence, vocabulary, width, heads, feed-forward width, blocks, batch)
    if smoke:
        encoder, decoder = (16, 64, 32, 2, 64, 1, 8), (32, 512, 128, 2, 512, 1, 16)
        size, widths, cnn_batch = 32, (16, 32), 16
    else:
        encoder = decoder = (256, 8192, 768, 12, 3072, 2, 64)
        size, widths, cnn_batch = 64, (64, 128, 256, 512), 128

    def shape(dims: tuple[int, ...]) -> str:
        return f"{dims[5]} blocks, width {dims[2]}, {dims[3]} heads, sequence {dims[0]}"

    found = [
        Workload(
            "transformer",
            f"BERT-style encoder ({shape(encoder)}, attention dropout 0.1), batch {encoder[6]}",
            lambda: build_encoder(*encoder[:6]),
            marker_tokens(*encoder[:2]),
            encoder[6],
        ),
        Workload(
            "gpt",
            f"GPT-style causal decoder ({shape(decoder)}, vocabulary {decoder[1]}), "
            f"batch {decoder[6]}",
            lambda: build_decoder(*decoder[:6]),
            language_tokens(*decoder[:2]),
            decoder[6],
            logits=True,
        ),
        Workload(
            "resnet",
            f"ResNet-style CNN ({len(widths)} stages {'/'.join(map(str, widths))}, "
            f"{size}x{size}), batch {cnn_batch}",
            lambda: build_resnet(size, widths),
            images(size),
            cnn_batch,
            search_baseline=None,
        ),
    ]
    return {workload.name: workload for workload in found}


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


def compile_model(model: keras.Model, workload: Workload, loss_scale: bool = False) -> None:
    """Compiles with Adam and the workload's loss; `loss_scale` wraps Adam as Keras does."""
    optimizer = keras.optimizers.Adam(1e-3)
    if loss_scale:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss=workload.loss())


def build_uniform(workload: Workload, policy: str, weights: list | None) -> keras.Model:
    """The model built and compiled under Keras' global `policy`, with `weights` if given."""
    with global_policy(policy):
        keras.utils.set_random_seed(0)
        model = workload.build()
        if weights is not None:
            model.set_weights(weights)
        compile_model(model, workload)  # under mixed_float16 Keras adds LossScaleOptimizer
    return model


def build_planned(
    workload: Workload, plan: autoprec.PrecisionPlan, weights: list | None, x_sample: Any
) -> keras.Model:
    """A float32 copy with `plan` applied (`autoprec.apply_plan`), compiled alike.

    A plan with float16 layers gets Keras' `LossScaleOptimizer`, as Keras gives
    `mixed_float16`.
    """
    with global_policy("float32"):
        keras.utils.set_random_seed(0)
        model = workload.build()
        if weights is not None:
            model.set_weights(weights)
    autoprec.apply_plan(model, plan, x=x_sample)
    compile_model(model, workload, loss_scale=plan.uses_float16)
    return model


def composition(plan: autoprec.PrecisionPlan) -> dict[str, int]:
    """Layers of a plan per compute dtype."""
    return dict(sorted(plan.dtype_counts().items()))


def plan_report(metadata: dict[str, Any]) -> dict[str, Any]:
    """The plan's own figures on what was measured, predicted and chosen (read defensively)."""
    report: dict[str, Any] = {}
    sources = [("", metadata)]
    if isinstance(metadata.get("search"), dict):
        sources.append(("search.", metadata["search"]))
    for prefix, source in sources:
        for key, value in source.items():
            if value is not None and any(word in str(key).lower() for word in REPORT_WORDS):
                report[prefix + str(key)] = value
    return report


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
    handler, level, propagate = MessageCapture(), logger.level, logger.propagate
    interactive = keras.config.is_interactive_logging_enabled()
    keras.config.disable_interactive_logging()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
        if interactive:
            keras.config.enable_interactive_logging()


def failure(error: BaseException) -> dict[str, str]:
    """An error as recorded in the results: its line and its traceback's tail."""
    return {
        "error": f"{type(error).__name__}: {error}"[:2000],
        "traceback": traceback.format_exc()[-3000:],
    }


@contextlib.contextmanager
def stage(record: dict[str, Any], name: str) -> Iterator[None]:
    """Times one stage into `record["stages"][name]`; a failure is recorded, not raised."""
    entry: dict[str, Any] = {}
    record.setdefault("stages", {})[name] = entry
    started, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    except Exception as error:  # noqa: BLE001 - one failed stage must not stop the run
        entry.update(failure(error))
    finally:
        entry["seconds"] = round(time.perf_counter() - started, 3)
        entry["cpu_seconds"] = round(time.process_time() - cpu, 3)
        outcome = f"FAILED {entry['error'][:300]}" if "error" in entry else "done"
        print(f"  {name}: {outcome} ({entry['seconds']:.1f} s)", flush=True)


# ---------------------------------------------------------------------- timing


def train_step(model: keras.Model, x: Any, y: Any) -> Callable[[], float]:
    """One `train_on_batch` on the fixed batch, synchronised by reading the loss."""

    def step() -> float:
        logs = model.train_on_batch(x, y, return_dict=True)
        return float(logs["loss"])

    return step


def time_interleaved(
    steps: dict[str, Callable[[], float]],
    rounds: int,
    steps_per_round: int,
    failures: dict[str, dict[str, str]],
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Mean seconds per step of each function, per round, in rounds whose order rotates.

    Each function first runs `steps_per_round` untimed steps (the warm-up, which also
    compiles); one that fails there is recorded in `failures` and left out. Returns the
    per-round seconds and each function's last loss.
    """
    names, losses = [], {}
    for name, step in steps.items():
        try:
            for _ in range(steps_per_round):
                losses[name] = step()
        except Exception as error:  # noqa: BLE001 - the other candidates are still timed
            failures[name] = failure(error)
            continue
        names.append(name)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            for _ in range(steps_per_round):
                losses[name] = steps[name]()
            samples[name].append((time.perf_counter() - started) / steps_per_round)
    return samples, losses


def compare(candidates: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The best uniform policy (by min and by median) and each plan's ratio to it.

    A plan without figures (it failed) has ratio `None`, and so has every plan when no
    uniform policy was timed.
    """
    uniform = {name: figures for name, figures in candidates.items() if name in UNIFORM}
    uniform = {name: figures for name, figures in uniform.items() if "ms_min" in figures}
    best = {
        statistic: (
            min(uniform, key=lambda name: uniform[name][f"ms_{statistic}"]) if uniform else None
        )
        for statistic in STATISTICS
    }
    ratios: dict[str, Any] = {}
    for name in PLANS:
        figures = candidates.get(name, {})
        if "ms_min" not in figures or not uniform:
            ratios[name] = None
            continue
        ratios[name] = {
            statistic: figures[f"ms_{statistic}"] / uniform[best[statistic]][f"ms_{statistic}"]
            for statistic in STATISTICS
        }
    return {"best_uniform": best, "ratios": ratios}


# ---------------------------------------------------------------------- one model


class Clock:
    """The run's time budget: an end for the whole run, shared out between its stages.

    Args:
        budget_seconds: the whole run's seconds.
        reserve_seconds: seconds kept for the stages after the models' own (the
            overflow check and the memory process).
    """

    def __init__(self, budget_seconds: float, reserve_seconds: float) -> None:
        self.started = time.monotonic()
        self.end = self.started + budget_seconds
        #: Past the budget, the memory process is stopped and what it wrote is kept.
        self.hard_end = self.end + HARD_END_SECONDS
        self.reserve = reserve_seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def model_end(self, models_left: int) -> float:
        """The end (monotonic) of the next model's equal share of the time left."""
        share = max(0.0, self.left() - self.reserve) / max(1, models_left)
        return time.monotonic() + share


def out_of_time(record: dict[str, Any], name: str, end: float) -> bool:
    """Whether stage `name` must be skipped (its time is spent); a skip is recorded."""
    if time.monotonic() <= end:
        return False
    record.setdefault("stages", {})[name] = {
        "error": "skipped: this model's share of the time budget was spent",
        "seconds": 0.0,
    }
    print(f"  {name}: skipped (time budget)", flush=True)
    return True


def run_model(
    workload: Workload, settings: Settings, model_end: float
) -> tuple[dict[str, Any], dict[str, autoprec.PrecisionPlan]]:
    """Builds, decides and times every candidate of one model; its record and its plans."""
    started = time.perf_counter()
    batch = workload.batch_size
    hardware = settings.hardware(workload.name)
    row: dict[str, Any] = {
        "kind": workload.kind,
        "batch_size": batch,
        "hardware": hardware,
        "stages": {},
        "plans": {},
    }
    x, y = workload.data(0, batch * settings.epoch_steps)
    x_val, y_val = workload.data(1, batch * (2 if settings.smoke else 4))
    keras.backend.clear_session()
    models: dict[str, keras.Model] = {}
    plans: dict[str, autoprec.PrecisionPlan] = {}
    failures: dict[str, dict[str, str]] = {}

    with stage(row, "build"):
        reference = build_uniform(workload, "float32", None)
        row["parameters"] = int(reference.count_params())
        models["float32"] = reference
        for policy in UNIFORM[1:]:
            try:
                models[policy] = build_uniform(workload, policy, reference.get_weights())
            except Exception as error:  # noqa: BLE001
                failures[policy] = failure(error)
    if "float32" not in models:
        row["candidates"] = {name: {"error": "build failed"} for name in CANDIDATES}
        row.update(compare(row["candidates"]))
        return row, plans
    weights = models["float32"].get_weights()

    if not out_of_time(row, "one-liner", model_end):
        with stage(row, "one-liner"):
            info = row["plans"]["one-liner"] = {}
            copy = build_uniform(workload, "float32", weights)
            callback = autoprec.AutoPrecision(hardware=hardware, auto=settings.auto)
            fit_started = time.perf_counter()
            with captured_messages() as messages:
                try:
                    history = copy.fit(
                        x,
                        y,
                        batch_size=batch,
                        epochs=1,
                        shuffle=False,
                        verbose=0,
                        callbacks=[callback],
                    )
                finally:
                    info["fit_seconds"] = time.perf_counter() - fit_started
                    info["messages"] = messages.lines[-30:]
            info["epoch_loss"] = history.history.get("loss", [None])[-1]
            plans["one-liner"] = callback.plan
            info.update(describe_plan(callback.plan))
            del copy, callback

    if not out_of_time(row, "search", model_end):
        with stage(row, "search"):
            info = row["plans"]["search"] = {}
            info["timeout"] = max(5.0, 0.45 * (model_end - time.monotonic()))
            search_started = time.perf_counter()
            try:
                result = autoprec.search(
                    models["float32"],
                    (x, y),
                    validation_data=(x_val, y_val),
                    budget=autoprec.Budget("val_loss", max_relative_drop=0.05),
                    hardware=hardware,
                    n_trials=settings.trials,
                    timeout=info["timeout"],
                    verbose=0,
                    settings=autoprec.SearchSettings(
                        batch_size=batch,
                        steps_per_trial=settings.trial_steps,
                        seed=0,
                        baseline=workload.search_baseline,
                        confirm_steps=settings.confirm_steps,
                    ),
                )
            finally:
                models["float32"].set_weights(weights)
                info["search_seconds"] = time.perf_counter() - search_started
            plans["search"] = result.plan
            info.update(describe_plan(result.plan))
            info["trials"] = len(result.study.trials)
            info["report"] = result.report().splitlines()[:40]

    if not out_of_time(row, "float8", model_end):
        with stage(row, "float8"):
            plan = float8_plan(models["float32"])
            if plan is not None:
                plans["float8"] = plan
                row["plans"]["float8"] = describe_plan(plan)

    with stage(row, "candidates"):
        for name in PLANS:
            if name not in plans:
                failures[name] = {"error": f"no plan: the {name} stage failed or was skipped"}
                continue
            try:
                models[name] = build_planned(workload, plans[name], weights, x[:1])
            except Exception as error:  # noqa: BLE001
                failures[name] = failure(error)

    row["candidates"] = {}
    with stage(row, "timing"):
        data = (jnp.asarray(x[:batch]), jnp.asarray(y[:batch]))
        steps = {name: train_step(model, *data) for name, model in models.items()}
        samples, losses = time_interleaved(steps, settings.rounds, settings.steps, failures)
        for name, values in samples.items():
            row["candidates"][name] = {
                "ms_min": min(values) * 1e3,
                "ms_median": statistics.median(values) * 1e3,
                "rounds_ms": [value * 1e3 for value in values],
                "final_loss": losses[name],
                "finite": math.isfinite(losses[name]),
                "optimizer": type(models[name].optimizer).__name__,
            }
    if "float8" in models:
        with stage(row, "float8_hlo"):
            row["float8_hlo"] = float8_hlo(models["float8"], workload, *data)
    for name in CANDIDATES:
        if name not in row["candidates"]:
            timing_error = row["stages"]["timing"].get("error", "not timed")
            row["candidates"][name] = failures.get(name, {"error": timing_error})
    row.update(compare(row["candidates"]))
    row["wall_seconds"] = time.perf_counter() - started
    return row, plans


def float8_plan(model: keras.Model) -> autoprec.PrecisionPlan | None:
    """float8 on every Dense/EinsumDense layer but the output layers, bfloat16 elsewhere.

    `None` for a model whose only float8-capable layers are its outputs (a CNN's head).
    """
    plan = autoprec.PrecisionPlan.uniform(model, "float8")
    outputs = output_layers(model, plan.layer_info)
    for path in sorted(outputs & set(plan.layers)):
        if plan.layers[path] == "float8":
            plan = plan.with_dtype(path, "bfloat16")
    return plan if plan.uses_float8 else None


#: HLO text of an FP8 matrix product after XLA's rewrites: cuBLASLt's FP8 GEMM custom call,
#: or a dot whose operands are 8-bit floats (XLA's own lowering).
FP8_GEMM_MARKERS = ("__cublas$lt$matmul$f8", "cublasLt$matmul$f8")


def float8_hlo(model: keras.Model, workload: Workload, x: Any, y: Any) -> dict[str, Any]:
    """Counts the FP8 matrix products in the compiled HLO of the model's gradient step.

    Lowers and compiles loss + gradients of the model (as the train step computes them)
    with `jax.jit`, and reads the optimised HLO: on a GPU of compute capability 8.9 or
    more, XLA rewrites Keras' quantize-dequantize around each float8 layer's matmul into
    an FP8 GEMM; elsewhere the count is 0 (the quantization is emulated).
    """
    loss = workload.loss()
    trainable = [variable.value for variable in model.trainable_variables]
    non_trainable = [variable.value for variable in model.non_trainable_variables]

    def loss_of(trainable_values, non_trainable_values, inputs, targets):
        outputs, _ = model.stateless_call(
            trainable_values, non_trainable_values, inputs, training=True
        )
        return loss(targets, outputs)

    compiled = jax.jit(jax.grad(loss_of)).lower(trainable, non_trainable, x, y).compile()
    text = compiled.as_text()
    lines = text.splitlines()
    gemms = [line for line in lines if any(marker in line for marker in FP8_GEMM_MARKERS)]
    dots = [line for line in lines if " dot(" in line and ("f8e4m3" in line or "f8e5m2" in line)]
    return {
        "device": jax.devices()[0].device_kind,
        "fp8_gemm_calls": len(gemms),
        "fp8_dots": len(dots),
        "f8_mentions": text.count("f8e4m3fn") + text.count("f8e5m2"),
        "examples": [line.strip()[:240] for line in (gemms or dots)[:3]],
    }


def describe_plan(plan: autoprec.PrecisionPlan) -> dict[str, Any]:
    """A plan's composition, what it recorded about its decision, and the plan itself."""
    metadata = dict(plan.metadata)
    measured = metadata.get("measured")
    return {
        "composition": composition(plan),
        "measured": measured if isinstance(measured, (dict, list)) else None,
        "report": plan_report(metadata),
        "metadata_keys": sorted(str(key) for key in metadata),
        "plan": json.loads(plan.to_json()),
    }


# ---------------------------------------------------------------------- memory


def memory_stats() -> dict[str, int] | None:
    """The first device's memory statistics; `None` where the backend keeps none (CPUs)."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - a backend without statistics
        return None
    return dict(stats) if stats else None


def is_out_of_memory(error: BaseException) -> bool:
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def tree_bytes(tree: Any) -> int:
    return int(sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(tree)))


def xla_bytes(compiled: Any) -> int | None:
    """XLA's bytes of one compiled step: arguments + outputs + temporaries - aliased."""
    try:
        analysis = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend analyses memory
        return None
    if analysis is None:
        return None
    return int(
        analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes
        + analysis.temp_size_in_bytes
        - analysis.alias_size_in_bytes
    )


def batch_of(x: np.ndarray, y: np.ndarray, size: int) -> tuple:
    """A device-resident batch of `size` samples (repeating the given ones), as Keras passes it."""
    repeat = -(-size // len(x))
    xs = np.concatenate([x] * repeat)[:size]
    ys = np.concatenate([y] * repeat)[:size]
    return (jnp.asarray(xs), jnp.asarray(ys), None)


class MemoryProbe:
    """One candidate's train step, compiled per batch size, run on copies of its state.

    The step is `jax.jit(model.train_step, donate_argnums=0)`, the function Keras
    compiles for `fit` and `train_on_batch`; each run donates a fresh copy of the
    model's state, so a step that runs out of memory leaves the model intact.
    """

    def __init__(self, model: keras.Model, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y
        model._symbolic_build(data_batch=(x, y))  # variables, optimizer and metrics, as fit
        self.state = (
            [variable.value for variable in model.trainable_variables],
            [variable.value for variable in model.non_trainable_variables],
            [variable.value for variable in model.optimizer.variables],
            [variable.value for variable in model.metrics_variables],
        )
        self.step = jax.jit(model.train_step, donate_argnums=0)
        self.executables: dict[int, Any] = {}

    def compile(self, size: int) -> Any:
        if size not in self.executables:
            data = batch_of(self.x, self.y, size)
            self.executables[size] = self.step.lower(self.state, data).compile()
        return self.executables[size]

    def run(self, size: int) -> float:
        """Compiles (once per size) and runs one step at batch `size`; returns its loss."""
        executable = self.compile(size)
        try:
            data = batch_of(self.x, self.y, size)
            state = jax.tree_util.tree_map(jnp.copy, self.state)
            logs, state = executable(state, data)
            return float(np.asarray(logs["loss"]))
        finally:
            if size != len(self.x):
                self.executables.pop(size, None)  # keep one executable: the timed batch's


def largest_batch(
    probe: MemoryProbe, base: int, cap: int, first_guess: int | None, steps: int, end: float
) -> dict[str, Any]:
    """The largest batch whose step fits: doubling until out of memory or `cap`, then bisection.

    Doubling starts at `first_guess` (rounded down to `base` times a power of two)
    where it is known, else at twice `base`; `base` is known to fit.
    """
    probes: list[dict[str, Any]] = []

    def fits(size: int) -> bool | None:
        if time.monotonic() > end:
            return None
        started = time.perf_counter()
        try:
            probe.run(size)
            ok = True
        except Exception as error:  # noqa: BLE001 - only out-of-memory is an answer
            if not is_out_of_memory(error):
                raise
            ok = False
        gc.collect()
        probes.append({"batch": size, "fits": ok, "seconds": time.perf_counter() - started})
        return ok

    low, high, bound = base, None, "cap"
    size = 2 * base
    if first_guess is not None and first_guess > 2 * base:
        size = base * 2 ** int(math.log2(first_guess / base))
    size = min(size, cap)
    while size > low:
        answer = fits(size)
        if answer is None:
            bound = "time"
            break
        if not answer:
            high, bound = size, "oom"
            break
        low, size = size, min(2 * size, cap)
    for _ in range(steps if high is not None else 0):
        middle = (low + high) // 2
        if middle in (low, high):
            break
        answer = fits(middle)
        if answer is None:
            bound = "time"
            break
        low, high = (middle, high) if answer else (low, middle)
    return {
        "max_batch": low,
        "first_oom_batch": high,
        "max_batch_bound": bound,
        "cap": cap,
        "first_guess": first_guess,
        "probes": probes,
    }


def peak_figures(
    before: dict[str, int] | None, after: dict[str, int] | None, probe: MemoryProbe, batch: int
) -> dict[str, Any]:
    """A step's memory figures from the device statistics before and after it."""
    state = tree_bytes(probe.state)
    figures: dict[str, Any] = {
        "state_bytes": state,
        "batch_bytes": tree_bytes(batch_of(probe.x, probe.y, batch)),
        "peak_bytes_in_use": None,
        "step_bytes": None,
        "peak_bytes": None,
        "peak_is_own": None,
        "bytes_in_use_before": None,
        "bytes_limit": None,
    }
    if not before or not after or "peak_bytes_in_use" not in after:
        return figures
    in_use = before.get("bytes_in_use", 0)
    own = after["peak_bytes_in_use"] > before.get("peak_bytes_in_use", 0)
    figures.update(
        peak_bytes_in_use=after["peak_bytes_in_use"],
        peak_is_own=own,
        bytes_in_use_before=in_use,
        bytes_limit=after.get("bytes_limit"),
    )
    if own:
        # The step's own: the state copy it donates, its batch, temporaries and outputs;
        # with the model's variables, the candidate's peak as if it ran alone.
        figures["step_bytes"] = after["peak_bytes_in_use"] - in_use
        figures["peak_bytes"] = state + figures["step_bytes"]
    return figures


def predicted_batch(entry: dict[str, Any], batch: int) -> int | None:
    """The batch the device's free memory should hold, scaling the step's bytes per sample."""
    stats = memory_stats()
    step, state = entry.get("step_bytes"), entry.get("state_bytes", 0)
    if not stats or not stats.get("bytes_limit") or not step:
        return None
    free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    per_sample = max(1.0, (step - state) / batch)
    return int((free - state) / per_sample)


def build_candidate(workload: Workload, candidate: str, weights: list, plan_path: str | None):
    """A candidate in the memory process: a uniform policy, or a plan read from its JSON."""
    if candidate in UNIFORM:
        return build_uniform(workload, candidate, weights)
    plan = autoprec.PrecisionPlan.load(plan_path)
    return build_planned(workload, plan, weights, workload.data(0, 1)[0])


def measure_memory(request: dict[str, Any]) -> dict[str, Any]:
    """The memory process: every candidate's step bytes, peak and largest batch.

    All candidates of all models are compiled first; their steps then run once each,
    in ascending order of XLA's bytes, so each step raises the device's high-water mark
    to its own peak; the largest-batch searches come last, each given an equal share of
    the time left.
    """
    settings = settings_for(request["smoke"])
    known = workloads(request["smoke"])
    end = time.monotonic() + request["seconds"]
    results: dict[str, dict[str, Any]] = {}
    probes: dict[tuple[str, str], MemoryProbe] = {}
    keras.backend.clear_session()
    for name, plan_paths in request["models"].items():
        workload, results[name] = known[name], {}
        x, y = workload.data(0, workload.batch_size)
        weights = build_uniform(workload, "float32", None).get_weights()
        for candidate in CANDIDATES:
            if candidate in PLANS and candidate not in plan_paths:
                results[name][candidate] = {"error": f"no plan: the {candidate} stage failed"}
                continue
            try:
                model = build_candidate(workload, candidate, weights, plan_paths.get(candidate))
                probe = MemoryProbe(model, x, y)
                results[name][candidate] = {
                    "xla_bytes": xla_bytes(probe.compile(workload.batch_size)),
                    "optimizer": type(model.optimizer).__name__,
                }
                probes[(name, candidate)] = probe
            except Exception as error:  # noqa: BLE001
                results[name][candidate] = failure(error)
        write_json(request["out"], results)
    order = sorted(probes, key=lambda key: results[key[0]][key[1]]["xla_bytes"] or 0)
    for name, candidate in order:
        entry, batch = results[name][candidate], known[name].batch_size
        try:
            before = memory_stats()
            entry["loss"] = probes[(name, candidate)].run(batch)
            entry.update(peak_figures(before, memory_stats(), probes[(name, candidate)], batch))
        except Exception as error:  # noqa: BLE001
            entry.update(failure(error))
            del probes[(name, candidate)]
        write_json(request["out"], results)
    remaining = [key for key in order if key in probes]
    for index, (name, candidate) in enumerate(remaining):
        entry, batch = results[name][candidate], known[name].batch_size
        share_end = time.monotonic() + (end - time.monotonic()) / (len(remaining) - index)
        try:
            entry.update(
                largest_batch(
                    probes[(name, candidate)],
                    batch,
                    batch * settings.cap_factor,
                    predicted_batch(entry, batch),
                    settings.bisection_steps,
                    share_end,
                )
            )
        except Exception as error:  # noqa: BLE001
            entry.update(failure(error))
        write_json(request["out"], results)
    return results


def run_memory_process(
    settings: Settings,
    plan_paths: dict[str, dict[str, str]],
    seconds: float,
    hard_end: float,
    folder: Path,
) -> dict[str, Any]:
    """Runs the memory process (this script, `--memory-child`); returns what it wrote.

    Whatever it wrote before failing or running out of time is kept; every candidate it
    did not finish gets the process's exit status and the tail of its output.
    """
    request = {
        "smoke": settings.smoke,
        "models": plan_paths,
        "seconds": seconds,
        "out": str(folder / "memory.json"),
    }
    request_path = folder / "memory-request.json"
    request_path.write_text(json.dumps(request))
    environment = dict(os.environ)
    if sys.modules.get("tensorflow", False) is None:
        environment["BENCH_GPU_BLOCK_TENSORFLOW"] = "1"
    environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    command = [sys.executable, str(Path(__file__).resolve()), "--memory-child", str(request_path)]
    if settings.smoke:
        command.append("--smoke-child")
    log = folder / "memory.log"
    started = time.perf_counter()
    with log.open("w") as output:
        try:
            status: int | str = subprocess.run(
                command, env=environment, stdout=output, stderr=subprocess.STDOUT,
                timeout=max(20.0, hard_end - time.monotonic()), check=False,
            ).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            status = "timeout"
    written = Path(request["out"])
    results = json.loads(written.read_text()) if written.exists() else {}
    tail = log.read_text(errors="replace")[-3000:]
    for name in plan_paths:
        for candidate in CANDIDATES:
            entry = results.setdefault(name, {}).setdefault(candidate, {})
            if "max_batch" not in entry and "error" not in entry:
                entry["error"] = f"memory process ended (status {status}) before this candidate"
                entry["traceback"] = tail
    return {
        "status": status,
        "seconds": time.perf_counter() - started,
        "results": results,
        "output_tail": tail if status != 0 else "",
    }


# ---------------------------------------------------------------------- attention overflow


def build_overflow(smoke: bool) -> tuple[Callable[[], keras.Model], np.ndarray, np.ndarray]:
    """Query/key kernels of 1/features on inputs of ~300: q, k ~ 300 but q·k/sqrt(d) ~ 1e5."""
    rng = np.random.default_rng(3)
    batch, sequence, features, heads = (4, 8, 16, 2) if smoke else (32, 256, 64, 4)

    def build() -> keras.Model:
        inputs = keras.Input((sequence, features), name="sequence")
        attention = keras.layers.MultiHeadAttention(
            num_heads=heads, key_dim=features, dropout=0.1, name="attention"
        )
        x = attention(inputs, inputs)
        x = keras.layers.LayerNormalization(name="norm")(x)
        x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
        outputs = keras.layers.Dense(1, name="head")(x)
        model = keras.Model(inputs, outputs, name="attention_overflow")
        for dense in (attention.query_dense, attention.key_dense):
            dense.kernel.assign(np.full(dense.kernel.shape, 1.0 / features, "float32"))
        return model

    x = (rng.uniform(0.5, 1.5, size=(batch, sequence, features)) * 300).astype("float32")
    y = rng.normal(size=(batch, 1)).astype("float32")
    return build, x, y


def attention_logits_amax(model: keras.Model, x: np.ndarray) -> float:
    """The largest |q·k|/sqrt(d) of the model's attention layer, computed in float32."""
    attention = model.get_layer("attention")
    query = np.asarray(attention.query_dense(x), "float64")
    key = np.asarray(attention.key_dense(x), "float64")
    logits = np.einsum("bthd,bshd->bhts", query, key) / math.sqrt(attention.key_dim)
    return float(np.abs(logits).max())


def train_steps(model: keras.Model, x, y, steps: int, callbacks: list) -> dict[str, Any]:
    """Trains `steps` steps on one batch (one step per epoch: a loss per step)."""
    history = model.fit(
        x, y, batch_size=len(x), epochs=steps, shuffle=False, verbose=0, callbacks=callbacks
    )
    losses = [float(value) for value in history.history["loss"]]
    weights_finite = all(np.isfinite(weight).all() for weight in model.get_weights())
    optimizer = model.optimizer
    scale = getattr(optimizer, "dynamic_scale", None)
    return {
        "losses": losses,
        "final_loss": losses[-1],
        "finite": bool(math.isfinite(losses[-1]) and weights_finite),
        "optimizer": type(optimizer).__name__,
        "loss_scale": float(np.asarray(scale.value)) if scale is not None else None,
    }


def overflow_check(settings: Settings) -> dict[str, Any]:
    """Uniform float16 must overflow in q·k; the one-liner's plan must train finitely."""
    build, x, y = build_overflow(settings.smoke)
    workload = Workload("attention_overflow", "", build, lambda seed, n: (x, y), len(x), None)
    record: dict[str, Any] = {
        "note": "q, k ~ 300 per element, q·k/sqrt(d) ~ 1e5 > 65504; layer outputs modest",
        "candidates": {},
        "stages": {},
    }
    keras.backend.clear_session()
    reference = build_uniform(workload, "float32", None)
    weights = reference.get_weights()
    record["logits_amax"] = attention_logits_amax(reference, x)
    for policy in UNIFORM:
        with stage(record, policy):
            model = build_uniform(workload, policy, weights)
            record["candidates"][policy] = train_steps(model, x, y, settings.overflow_steps, [])
    with stage(record, "one-liner"):
        copy = build_uniform(workload, "float32", weights)
        hardware = settings.hardware("attention_overflow")
        record["hardware"] = hardware
        callback = autoprec.AutoPrecision(hardware=hardware, auto=settings.auto, verbose=0)
        repeats = max(1, settings.epoch_steps)
        copy.fit(
            np.concatenate([x] * repeats),
            np.concatenate([y] * repeats),
            batch_size=len(x),
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=[callback],
        )
        plan = callback.plan
        model = build_uniform(workload, "float32", weights)
        trainer = autoprec.AutoPrecision(plan, hardware=hardware, verbose=0)
        figures = train_steps(model, x, y, settings.overflow_steps, [trainer])
        figures["composition"] = composition(plan)
        figures["attention_dtypes"] = {
            path: dtype for path, dtype in plan.layers.items() if path.startswith("attention")
        }
        figures["events"] = [dict(event) for event in trainer.plan.events]
        figures["plan"] = json.loads(plan.to_json())
        record["candidates"]["one-liner"] = figures
    float16 = record["candidates"].get("mixed_float16", {})
    oneliner = record["candidates"].get("one-liner", {})
    record["float16_overflows"] = float16.get("finite") is False
    record["plan_trains_finitely"] = oneliner.get("finite") is True
    record["passed"] = bool(
        record["logits_amax"] > FLOAT16_MAX
        and record["float16_overflows"]
        and record["plan_trains_finitely"]
    )
    return record


# ---------------------------------------------------------------------- results


def finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by `None` (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return finite(value.item())
    return value


def write_json(path: str | os.PathLike, report: dict[str, Any]) -> None:
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


def host() -> dict[str, Any]:
    """The CPU's model name and 16-bit flags (`lscpu`), the devices and the versions."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        text = ""
    cpu, flags = platform.processor() or platform.machine(), set()
    for line in text.splitlines():
        if line.lower().startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
        elif line.lower().startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
    stats = memory_stats()
    device = jax.devices()[0]
    try:
        detected = autoprec.hardware.detect()
        hardware = {
            key: getattr(detected, key, None)
            for key in ("name", "display_name", "kind", "compute_capability", "fast_dtypes",
                        "slow_dtypes", "memory_bytes", "source")
        }  # fmt: skip
    except Exception as error:  # noqa: BLE001 - recorded, not needed
        hardware = {"error": f"{type(error).__name__}: {error}"}
    return {
        "cpu": cpu,
        "cpu_16bit_flags": sorted(
            flag for flag in flags if flag in ("avx512_bf16", "avx512_fp16") or "amx" in flag
        ),
        "cores": os.cpu_count(),
        "keras_backend": keras.backend.backend(),
        "keras": keras.__version__,
        "jax": jax.__version__,
        "autoprec": autoprec.__version__,
        "python": sys.version.split()[0],
        "devices": [str(device) for device in jax.devices()],
        "device_kind": device.device_kind,
        "device_compute_capability": getattr(device, "compute_capability", None),
        "device_bytes_limit": stats.get("bytes_limit") if stats else None,
        "autoprec_hardware": hardware,
        "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
        "tensorflow_imported": sys.modules.get("tensorflow") is not None,
    }


def megabytes(value: Any) -> str:
    return f"{value / 2**20:.1f}" if isinstance(value, (int, float)) else "-"


def table(results: dict[str, Any]) -> str:
    """The results table: ms per step, ratio to the best uniform policy, memory, largest batch."""
    header = (
        f"{'model':<12} {'candidate':<15} {'ms min':>9} {'median':>9} {'/best min':>9} "
        f"{'/best med':>9} {'xla MB':>9} {'peak MB':>9} {'max batch':>14}"
    )
    lines = [header]
    for name, row in results["models"].items():
        for candidate in CANDIDATES:
            timing = row.get("candidates", {}).get(candidate, {})
            memory = row.get("memory", {}).get(candidate, {})
            ratio = (row.get("ratios") or {}).get(candidate) or {}
            if "ms_min" in timing:
                cells = f"{timing['ms_min']:9.2f} {timing['ms_median']:9.2f}"
            else:
                cells = f"{'ERROR':>9} {'':>9}"
            ratios = " ".join(
                f"{ratio[statistic]:8.3f}x" if statistic in ratio else f"{'':>9}"
                for statistic in STATISTICS
            )
            if "max_batch" in memory:
                mark = {"oom": "", "cap": ">=", "time": ">="}.get(memory["max_batch_bound"], "")
                batch = f"{mark}{memory['max_batch']} ({memory['max_batch_bound']})"
            else:
                batch = "ERROR" if "error" in memory else "-"
            lines.append(
                f"{name:<12} {candidate:<15} {cells} {ratios} "
                f"{megabytes(memory.get('xla_bytes')):>9} {megabytes(memory.get('peak_bytes')):>9} "
                f"{batch:>14}"
            )
        best = row.get("best_uniform", {})
        lines.append(
            f"{'':<12} best uniform: {best.get('min')} (min), {best.get('median')} (median)"
        )
        for plan, info in row.get("plans", {}).items():
            counts = info.get("composition")
            if counts:
                text = ", ".join(f"{count} {dtype}" for dtype, count in counts.items())
                lines.append(f"{'':<12} {plan} plan: {text}")
        failed = [stage for stage, entry in row.get("stages", {}).items() if "error" in entry]
        if failed or "error" in row:
            lines.append(f"{'':<12} FAILED: {', '.join(failed) or row.get('error', '')[:200]}")
    overflow = results.get("attention_overflow")
    if overflow:
        cells = []
        for candidate, figures in overflow.get("candidates", {}).items():
            state = "finite" if figures.get("finite") else "NON-FINITE"
            cells.append(f"{candidate} {state}")
        lines.append(
            f"attention overflow (max q·k {overflow.get('logits_amax', float('nan')):.3g}): "
            + ", ".join(cells)
            + f" -> {'PASS' if overflow.get('passed') else 'FAIL'}"
        )
    process = results.get("memory_process", {})
    settings = results.get("settings", {})
    lines.append(
        f"ms: whole train step (train_on_batch), {settings.get('rounds')} interleaved rounds of "
        f"{settings.get('steps')} steps; memory process status {process.get('status')} "
        f"({process.get('seconds', 0):.0f} s); peak MB '-' where the device keeps no statistics"
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------- entry point


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny models on a CPU (~1 minute)")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_out"), help="results folder")
    parser.add_argument("--models", default=None, help="comma-separated subset of the models")
    parser.add_argument("--no-overflow", action="store_true", help="skip the overflow check")
    parser.add_argument(
        "--measure-here",
        action="store_true",
        help="smoke run: measure costs here (hardware='local') for every model, as the GPU run does",
    )
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=None,
        help="end the run within this many seconds (default 400; smoke 240, a cap)",
    )
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--smoke-child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def use_compilation_cache(folder: Path) -> str:
    """Turns on JAX's persistent compilation cache (in `folder` unless one is set), for children too.

    The same architecture is compiled many times here (the one-liner's and the search's
    candidates, the timed copies, the memory process): identical programs then compile
    once. Only compile time changes; the executables are the same.
    """
    path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(folder / "xla-cache")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs",
        float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
    )
    return path


def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Runs every stage of the benchmark; returns the results (also written after each stage)."""
    settings = settings_for(args.smoke)
    if args.measure_here:
        settings = dataclasses.replace(settings, measured_models=None)
    budget = args.budget_seconds or (240.0 if args.smoke else 400.0)
    reserve = MEMORY_RESERVE[args.smoke] + (
        0.0 if args.no_overflow else OVERFLOW_RESERVE[args.smoke]
    )
    clock = Clock(budget, reserve)
    known = workloads(args.smoke)
    names = args.models.split(",") if args.models else list(known)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(
            f"bench/gpu.py: unknown --models {unknown}; choose from {', '.join(known)}"
        )
    out = Path(args.out) / "results.json"
    results: dict[str, Any] = {
        "environment": host(),
        "smoke": args.smoke,
        "settings": {
            **{key: getattr(settings, key) for key in Settings.__dataclass_fields__},
            "auto": repr(settings.auto),
            "budget_seconds": budget,
            "compilation_cache": use_compilation_cache(folder),
        },
        "models": {},
    }
    print(json.dumps(results["environment"]), flush=True)
    plan_paths: dict[str, dict[str, str]] = {}
    for index, name in enumerate(names):
        model_end = clock.model_end(len(names) - index)
        print(f"== {name}: {known[name].kind} ({model_end - time.monotonic():.0f} s)", flush=True)
        try:
            row, plans = run_model(known[name], settings, model_end)
        except Exception as error:  # noqa: BLE001 - one model must not stop the others
            row, plans = {"kind": known[name].kind, **failure(error)}, {}
        plan_paths[name] = {}
        for plan_name, plan in plans.items():
            plan_paths[name][plan_name] = str(folder / f"{name}-{plan_name}.json")
            plan.save(plan_paths[name][plan_name])
        results["models"][name] = row
        results["elapsed_seconds"] = time.monotonic() - clock.started
        write_json(out, results)
        gc.collect()
    if not args.no_overflow:
        print("== attention overflow", flush=True)
        try:
            results["attention_overflow"] = overflow_check(settings)
        except Exception as error:  # noqa: BLE001
            results["attention_overflow"] = failure(error)
        write_json(out, results)
    print(f"== memory ({clock.left():.0f} s)", flush=True)
    keras.backend.clear_session()
    gc.collect()
    seconds = max(5.0, clock.left() - 5.0)
    if args.smoke:
        seconds = min(seconds, MEMORY_RESERVE[True])  # a probe or two is enough to check it
    process = run_memory_process(settings, plan_paths, seconds, clock.hard_end, folder)
    print(f"  memory process: status {process['status']} ({process['seconds']:.0f} s)", flush=True)
    results["memory_process"] = {
        key: value for key, value in process.items() if key != "results"
    } | {"timing_process_memory": memory_stats()}
    for name in names:
        results["models"][name]["memory"] = process["results"].get(name, {})
    results["environment"]["tensorflow_imported_at_end"] = sys.modules.get("tensorflow") is not None
    results["elapsed_seconds"] = time.monotonic() - clock.started
    write_json(out, results)
    print(f"\nresults: {out}  ({results['elapsed_seconds']:.0f} s)")
    return results


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; writes `results.json` and prints the table. Returns the exit status."""
    args = parse(argv)
    if keras.backend.backend() != "jax":
        print(f"bench/gpu.py runs on KERAS_BACKEND=jax, not {keras.backend.backend()!r}")
        return 2
    if args.memory_child:
        request = json.loads(Path(args.memory_child).read_text())
        measure_memory(request)
        return 0
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    previous_cache = os.environ.get("AUTOPREC_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as folder:
        # Costs measured by the one-liner serve the search too; nothing from earlier runs.
        os.environ["AUTOPREC_CACHE_DIR"] = str(Path(folder) / "costs")
        try:
            results = run(args, Path(folder))
        finally:
            if previous_cache is None:
                os.environ.pop("AUTOPREC_CACHE_DIR", None)
            else:
                os.environ["AUTOPREC_CACHE_DIR"] = previous_cache
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
