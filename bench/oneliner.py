"""The "never slower" benchmark: the one-liner and the search's plan against Keras' uniform policies.

For each model (CNNs with and without depthwise convolutions, DenseNet121, a
Transformer encoder, two keras-hub decoders, a GRU text model, a wide MLP; data
generated here with a fixed seed, nothing downloaded) the candidates are:

- `float32`: the model as built;
- `mixed_bfloat16` (and `mixed_float16` where float16 is fast here, or with
  `--float16`): the same architecture built under
  `keras.config.set_dtype_policy(...)`, exactly as Keras applies that policy;
- `one-liner`: `model.fit(..., callbacks=[autoprec.AutoPrecision()])` for one short
  epoch on a copy (costs measured here, `hardware="local"`, nothing recalled from an
  earlier run: `AutoPlan(remember=False)`); its `callback.plan` is
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
import contextlib
import dataclasses
import gc
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import autoprec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/, for its shared `common`
from common import data  # noqa: E402
from common import models as builders  # noqa: E402
from common.data import seeded  # noqa: E402
from common.host import cores, cpu_model, environment, sixteen_bit_flags, versions  # noqa: E402
from common.keras_tools import (  # noqa: E402
    Workload,
    captured_messages,
    composition,
    fresh_copy,
    plan_report,
    search_val_loss,
    train_step,
)
from common.report import write_json  # noqa: E402
from common.timing import MIN_ROUNDS, fastest, milliseconds, ratios_to, time_steps  # noqa: E402
from oneliner_report import (  # noqa: E402
    MIN_BOUND,
    PLANS,
    print_model,
    print_summary,
    summarise,
)

UNIFORM = ("float32", "mixed_bfloat16", "mixed_float16")
NOISE = 1.05  # ratios within ~5 % of each other are noise here
#: plan.metadata keys shown as the one-liner's and the search's own report (read defensively)
REPORT_WORDS = ("measur", "predict", "evidence", "candidate", "timing", "timed", "chose")
#: keys of plan.metadata["search"] shown besides those: where the search's time went, its checks
SEARCH_KEYS = ("stage_seconds", "wall_seconds", "fidelity_check", "confirmation")

# ---------------------------------------------------------------------- models and data


CLASSES = data.CLASSES
VOCABULARY = builders.VOCABULARY


def image_data(size: int) -> Callable[[int, int], tuple[np.ndarray, np.ndarray]]:
    """Noise images with a per-class channel offset (learnable through pooling)."""
    return seeded(data.offset_images, size)


def marker_tokens(length: int) -> Callable[[int, int], tuple[np.ndarray, np.ndarray]]:
    """Random tokens with the class id (a token below `CLASSES`) at about a quarter of positions."""
    return seeded(data.marker_tokens, length, VOCABULARY)


def language_model_data(length: int) -> Callable[[int, int], tuple[dict, np.ndarray]]:
    """keras-hub decoder inputs; the target is a fixed function of the token at each position."""

    def generate(seed: int, samples: int):
        rng = np.random.default_rng(seed)
        tokens, targets = data.next_tokens(rng, samples, length, VOCABULARY)
        return {"token_ids": tokens, "padding_mask": np.ones((samples, length), "int32")}, targets

    return generate


def dense_data(features: int, classes: int):
    """Gaussian features labelled by a fixed random linear teacher on the first eight."""

    def generate(seed: int, samples: int):
        rng = np.random.default_rng(seed)
        teacher = np.random.default_rng(1234).normal(size=(8, classes))
        x = rng.normal(size=(samples, features)).astype("float32")
        return x, np.argmax(x[:, :8] @ teacher, axis=1).astype("int32")

    return generate


def keras_hub_lm(kind: str, length: int = 128) -> keras.Model:
    """keras-hub's GPT-2 or Llama causal LM, tiny configuration (2 blocks, width 256), random weights."""
    import keras_hub

    sizes = dict(vocabulary_size=VOCABULARY, num_layers=2, hidden_dim=256, intermediate_dim=1024)
    if kind == "gpt2":
        backbone = keras_hub.models.GPT2Backbone(num_heads=4, max_sequence_length=length, **sizes)
        return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    backbone = keras_hub.models.LlamaBackbone(num_query_heads=4, num_key_value_heads=2, **sizes)
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def build_transformer() -> keras.Model:
    """A two-block post-norm Transformer encoder classifier (64 tokens, width 256, 4 heads)."""
    return builders.encoder_classifier(length=64, width=256, heads=4, blocks=2, hidden=1024)


def build_mlp(features: int = 1024, width: int = 2048, depth: int = 4) -> keras.Model:
    """A wide MLP: `depth` Dense(`width`, relu) layers and a softmax head."""
    return builders.mlp(features, width, depth, name="wide_mlp")


MODELS: dict[str, Workload] = {
    spec.name: spec
    for spec in (
        Workload(
            "resnet",
            "CNN, no depthwise (ResNet-style, 32x32)",
            builders.resnet,
            image_data(32),
            32,
            search_baseline=None,
        ),
        Workload(
            "mobilenetv2",
            "CNN, depthwise (MobileNetV2, 64x64)",
            lambda: builders.application("mobilenetv2", 64),
            image_data(64),
            16,
            search_baseline=None,
        ),
        Workload(
            "densenet121",
            "DenseNet121 (64x64)",
            lambda: builders.application("densenet121", 64),
            image_data(64),
            16,
            search_baseline=None,
        ),
        Workload(
            "transformer",
            "Transformer encoder (2 MHA blocks)",
            build_transformer,
            marker_tokens(64),
            32,
        ),
        Workload(
            "gpt2",
            "keras-hub GPT-2 causal LM (tiny)",
            lambda: keras_hub_lm("gpt2"),
            language_model_data(128),
            16,
            True,
        ),
        Workload(
            "llama",
            "keras-hub Llama causal LM (tiny)",
            lambda: keras_hub_lm("llama"),
            language_model_data(128),
            16,
            True,
        ),
        Workload(
            "gru",
            "recurrent (2x GRU(256) text)",
            lambda: builders.gru_classifier(64),
            marker_tokens(64),
            32,
        ),
        Workload("mlp", "wide MLP (4x Dense(2048))", build_mlp, dense_data(1024, CLASSES), 32),
    )
}
#: Not in the default list: the smallest model, for the bench's own test.
EXTRA_MODELS = {
    "tiny": Workload(
        "tiny",
        "tiny MLP (2x Dense(64))",
        lambda: build_mlp(features=32, width=64, depth=2),
        dense_data(32, CLASSES),
        16,
    )
}
QUICK_MODELS = ("resnet", "mlp")


# ---------------------------------------------------------------------- building candidates


def build_copy(spec: Workload, weights: list | None, policy: str = "float32") -> keras.Model:
    """A compiled copy of `spec`'s model under Keras' global `policy`, with `weights` if given."""
    return fresh_copy(spec.build, weights, policy, spec.compile)


def first(x: Any, count: int) -> Any:
    """The first `count` samples of arrays or of a dict of arrays."""
    if isinstance(x, dict):
        return {key: value[:count] for key, value in x.items()}
    return x[:count]


def timed_fit(model: keras.Model, x, y, batch_size: int, callbacks: list) -> float:
    """Seconds of one epoch of `fit` (no shuffling, silent)."""
    started = time.perf_counter()
    model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return time.perf_counter() - started


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


def run_model(spec: Workload, settings: Settings) -> dict[str, Any]:
    """Builds, decides, times and compares every candidate of one model; its row of figures."""
    started = time.perf_counter()
    row: dict[str, Any] = {"kind": spec.kind, "batch_size": spec.batch_size, "errors": {}}
    batch = spec.batch_size
    x, y = spec.data(0, batch * settings.epoch_steps)
    x_val, y_val = spec.data(1, batch * 4)
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
    # Rounds decide afresh: nothing recalled from an earlier round or run.
    callback = autoprec.AutoPrecision(hardware="local", auto=autoprec.AutoPlan(remember=False))
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
            result = search_val_loss(
                reference,
                (x, y),
                (x_val, y_val),
                hardware="local",
                trials=settings.trials,
                batch_size=batch,
                steps_per_trial=settings.trial_steps,
                baseline=spec.search_baseline,
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
        name: {
            "composition": composition(plan),
            "report": plan_report(dict(plan.metadata), REPORT_WORDS, SEARCH_KEYS),
        }
        for name, plan in plans.items()
    }
    stages["candidates"], clock = time.perf_counter() - clock, time.perf_counter()

    steps = {name: train_step(model, x_batch, y_batch) for name, model in models.items()}
    samples, _ = time_steps(steps, settings.rounds, settings.steps)
    row["candidates"] = {name: milliseconds(values) for name, values in samples.items()}
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
    best = fastest(candidates, UNIFORM)
    ratios, verdicts = {}, {}
    for name in PLANS:
        if name not in candidates:
            verdicts[name] = "ERROR" if name in wanted else "n/a"
            continue
        ratios[name] = ratios_to(candidates[name], candidates, best)
        verdicts[name] = "PASS" if ratios[name]["min"] <= MIN_BOUND else "FAIL"
    sixteen = [name for name in uniform if name != "float32"]
    fastest_16 = min(sixteen, key=lambda name: uniform[name]["ms_min"]) if sixteen else None
    pays = bool(fastest_16 and uniform[fastest_16]["ms_min"] * NOISE < uniform["float32"]["ms_min"])
    return {"best_uniform": best, "ratios": ratios, "verdicts": verdicts, "sixteen_bit_pays": pays}


# ---------------------------------------------------------------------- host


def host_description() -> dict[str, Any]:
    """The CPU's model name and its 16-bit flags (`lscpu`), core count, frameworks."""
    import tensorflow as tf

    return {
        "cpu": cpu_model(),
        "flags": sixteen_bit_flags(),
        "cores": cores(),
        "gpus": [device.name for device in tf.config.list_physical_devices("GPU")],
        **versions("keras", "tensorflow", "autoprec"),
    }


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
        + (
            ""
            if rounds >= MIN_ROUNDS
            else f"; fewer than {MIN_ROUNDS} rounds: figures not conclusive"
        )
    )
    report: dict[str, Any] = {"host": host, "settings": dataclasses.asdict(settings), "models": {}}
    with cache as cache_dir, environment("AUTOPREC_CACHE_DIR", str(cache_dir)):
        rows = run_all(names, known, settings, report, args.json)
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
