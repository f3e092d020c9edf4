"""Per-layer plans against Keras' one global policy: predicted per card, measured on this CPU.

For each model, at realistic batches, on each card profile (RTX 2080 Ti, 3090, 4090,
5090, H100): the heuristic's plan (`autoprec.heuristic_plan` on the card's predicted
costs) against every uniform policy the card runs fast (`PrecisionPlan.uniform`, as
Keras' `mixed_*` policy sets it), by the same cost model at the same batch. Then the
rows where one rule cannot do it: on the RTX 2080 Ti (float16, no bfloat16), a model
whose profile (a real one, recorded here after one layer's kernel is scaled so that its
outputs pass 65504) rules uniform float16 out: the per-layer plan against float32.
Last, measured rows on this CPU: small models, costs timed here for float32 and
bfloat16, the plan's whole train step against each uniform policy's, interleaved.

Run: `python bench/uniform_first.py [--quick | --measured-only] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from common import host, keras_tools, models, report, timing  # noqa: E402

import autoprec  # noqa: E402
from autoprec import PrecisionPlan, cost  # noqa: E402

CARDS = ("rtx2080ti", "rtx3090", "rtx4090", "rtx5090", "h100")
UNIFORM = ("float32", "bfloat16", "float16")


def _lm(backbone: keras.Model, task: Callable[..., keras.Model]) -> keras.Model:
    model = task(backbone=backbone, preprocessor=None)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _tokens(length: int, vocabulary: int) -> Callable[[int], Any]:
    def sample(batch: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(0)
        return {
            "token_ids": rng.integers(1, vocabulary, (batch, length)).astype("int32"),
            "padding_mask": np.ones((batch, length), "int32"),
        }

    return sample


def _images(size: int) -> Callable[[int], Any]:
    return lambda batch: (
        np.random.default_rng(0).normal(size=(batch, size, size, 3)).astype("float32")
    )


def _ids(length: int) -> Callable[[int], Any]:
    return lambda batch: np.random.default_rng(0).integers(1, 500, (batch, length)).astype("int32")


def _classifier(model: keras.Model) -> keras.Model:
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def workloads() -> dict[str, tuple[Callable[[], keras.Model], Callable[[int], Any], tuple]]:
    """`{name: (build, sample(batch), batches)}`: the models of the benchmark, of eight kinds."""
    import keras_hub

    hub = keras_hub.models

    def vit() -> keras.Model:
        backbone = hub.ViTBackbone(
            image_shape=(64, 64, 3), patch_size=8, num_layers=4, num_heads=4,
            hidden_dim=256, mlp_dim=1024, use_mha_bias=True,
        )  # fmt: skip
        head = keras.layers.Dense(10, activation="softmax", name="head")
        inputs = keras.Input((64, 64, 3))
        features = backbone(inputs)[:, 0]
        return _classifier(keras.Model(inputs, head(features), name="vit"))

    def bert() -> keras.Model:
        backbone = hub.BertBackbone(
            vocabulary_size=8000, num_layers=4, num_heads=8, hidden_dim=512,
            intermediate_dim=2048, max_sequence_length=128,
        )  # fmt: skip
        model = hub.BertTextClassifier(backbone=backbone, num_classes=4, preprocessor=None)
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    def bert_sample(batch: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(0)
        return {
            "token_ids": rng.integers(1, 8000, (batch, 128)).astype("int32"),
            "segment_ids": np.zeros((batch, 128), "int32"),
            "padding_mask": np.ones((batch, 128), "int32"),
        }

    def gpt2() -> keras.Model:
        backbone = hub.GPT2Backbone(
            vocabulary_size=8000, num_layers=2, num_heads=8, hidden_dim=512,
            intermediate_dim=2048, max_sequence_length=128,
        )  # fmt: skip
        return _lm(backbone, hub.GPT2CausalLM)

    def llama() -> keras.Model:
        backbone = hub.LlamaBackbone(
            vocabulary_size=8000, num_layers=2, num_query_heads=8, num_key_value_heads=4,
            hidden_dim=512, intermediate_dim=1408,
        )  # fmt: skip
        return _lm(backbone, hub.LlamaCausalLM)

    def mixtral() -> keras.Model:
        backbone = hub.MixtralBackbone(
            vocabulary_size=8000, num_layers=2, num_query_heads=8, num_key_value_heads=4,
            hidden_dim=512, intermediate_dim=1024, num_experts=4, top_k=2,
        )  # fmt: skip
        return _lm(backbone, hub.MixtralCausalLM)

    return {
        "resnet50": (lambda: _classifier(models.application("resnet50", 64)), _images(64), (32, 256)),
        "mobilenetv2": (
            lambda: _classifier(models.application("mobilenetv2", 64)), _images(64), (64, 512),
        ),
        "vit": (vit, _images(64), (64, 512)),
        "bert_encoder": (bert, bert_sample, (32, 128)),
        "gpt2_decoder": (gpt2, _tokens(128, 8000), (16, 64)),
        "llama_decoder": (llama, _tokens(128, 8000), (16, 64)),
        "mixtral_moe": (mixtral, _tokens(128, 8000), (16, 64)),
        "gru_text": (
            lambda: _classifier(models.gru_classifier(128, vocabulary=8000, units=512)),
            lambda batch: np.random.default_rng(0).integers(1, 8000, (batch, 128)).astype("int32"),
            (64, 256),
        ),
    }  # fmt: skip


def _speedups(
    model: keras.Model, plan: PrecisionPlan, table: cost.CostTable, batch: int, card: str
) -> tuple[float, dict[str, float]]:
    """The plan's predicted speedup over float32, and each fast uniform policy's."""
    hardware = autoprec.hardware.resolve_hardware(card)
    step = cost.estimate(model, plan, costs=table, batch_size=batch)
    uniform = {}
    for dtype in UNIFORM:
        if dtype == "float32" or hardware.is_fast(dtype):
            policy = PrecisionPlan.uniform(model, dtype)
            uniform[dtype] = cost.estimate(model, policy, costs=table, batch_size=batch).speedup
    return step.speedup, uniform


def _counts(plan: PrecisionPlan) -> str:
    return ", ".join(f"{n} {d}" for d, n in keras_tools.composition(plan).items() if n)


def predicted_rows(name: str, build, sample, batches, cards) -> list[dict[str, Any]]:
    """One row per card and batch: the plan against the best uniform policy, predicted."""
    model = build()
    rows = []
    for card in cards:
        for batch in batches:
            table = cost.predict_costs(model, card, batch_size=batch, x=sample(2))
            plan = autoprec.heuristic_plan(model, costs=table, hardware=card)
            speedup, uniform = _speedups(model, plan, table, batch, card)
            best = max(uniform, key=uniform.get)
            rows.append(
                {
                    "model": name, "card": card, "batch": batch, "plan": _counts(plan),
                    "departures": len(plan.metadata["evidence"]), "plan_speedup": speedup,
                    "best_uniform": best, "uniform_speedup": uniform[best],
                    "ratio": speedup / uniform[best],
                }
            )  # fmt: skip
            print(_row_text(rows[-1]), flush=True)
    return rows


def _row_text(row: dict[str, Any]) -> str:
    return (
        f"{row['model']:<14} {row['card']:<10} b{row['batch']:<4} plan {row['plan_speedup']:.2f}x "
        f"[{row['plan']}; {row['departures']} off the start] best uniform {row['best_uniform']} "
        f"{row['uniform_speedup']:.2f}x  plan/uniform {row['ratio']:.3f}"
    )


def _hot_layer(model: keras.Model) -> str | None:
    """Scales the first Dense/Conv kernel past float16's range; returns its path."""
    from autoprec.layers import layer_paths

    for path, layer in layer_paths(model).items():
        kernel = getattr(layer, "kernel", None)
        if type(layer).__name__ in ("Dense", "Conv2D", "EinsumDense") and kernel is not None:
            kernel.assign(kernel * 1e6)
            return path
    return None


def unsafe_rows(name: str, build, sample, batches) -> list[dict[str, Any]]:
    """On the RTX 2080 Ti, a profile ruling float16 out for one layer: the plan against float32."""
    model = build()
    hot = _hot_layer(model)
    x = sample(8)
    per_token = len(model.outputs[0].shape) == 3  # a language model's targets are tokens
    y = np.zeros((8, 128) if per_token else (8,), "int32")
    profile = autoprec.profile(model, (x, y), steps=2, batch_size=4, verbose=0)
    unsafe = [path for path, layer in profile.layers.items() if not layer.float16_safe]
    rows = []
    for batch in batches:
        table = cost.predict_costs(model, "rtx2080ti", batch_size=batch, x=sample(2))
        plan = autoprec.heuristic_plan(model, profile, costs=table, hardware="rtx2080ti")
        speedup, uniform = _speedups(model, plan, table, batch, "rtx2080ti")
        rows.append(
            {
                "model": name, "card": "rtx2080ti", "batch": batch, "hot": hot,
                "unsafe_layers": len(unsafe), "plan": _counts(plan), "plan_speedup": speedup,
                "float16_ruled_out": uniform.get("float16"), "ratio_to_float32": speedup,
            }
        )  # fmt: skip
        print(
            f"{name:<14} rtx2080ti  b{batch:<4} {len(unsafe)} float16-unsafe layer(s): plan "
            f"{speedup:.2f}x float32 [{_counts(plan)}] (uniform float16, ruled out: "
            f"{uniform.get('float16', 0):.2f}x)",
            flush=True,
        )
    return rows


def measured_rows(rounds: int, steps: int) -> list[dict[str, Any]]:
    """On this CPU: costs timed here; the plan's whole train step against each uniform policy's."""
    hardware = autoprec.hardware.detect()
    cases = {
        "encoder": (lambda: models.encoder_classifier(length=64, width=128, heads=4, blocks=2, hidden=512), _ids(64), 32),
        "resnet_small": (lambda: models.resnet(32), _images(32), 32),
        "gru": (lambda: models.gru_classifier(32, units=128), _ids(32), 32),
        "mlp": (lambda: models.mlp(784, 1024, 3), lambda b: np.random.default_rng(0).normal(size=(b, 784)).astype("float32"), 256),
    }  # fmt: skip
    rows = []
    for name, (build, sample, batch) in cases.items():
        model = _classifier(build())
        x = sample(batch)
        y = np.zeros((batch,), "int32")
        table = cost.calibrate(
            model, x, dtypes=("float32", "bfloat16"), hardware=hardware, verbose=0
        )
        plan = autoprec.heuristic_plan(
            model, costs=table, hardware=hardware, dtypes=("float32", "bfloat16")
        )
        weights = model.get_weights()
        contenders = {"plan": plan, **{d: PrecisionPlan.uniform(model, d) for d in UNIFORM[:2]}}
        step_of = {}
        for label, candidate in contenders.items():
            copy = keras_tools.fresh_copy(build, weights, compile_with=_classifier)
            autoprec.apply_plan(copy, candidate)
            step_of[label] = keras_tools.train_step(copy, x, y)
        seconds, _ = timing.time_steps(step_of, rounds, steps)
        medians = {label: timing.spread(values)["median"] for label, values in seconds.items()}
        best = min((d for d in medians if d != "plan"), key=medians.get)
        rows.append(
            {
                "model": name, "batch": batch, "plan": _counts(plan),
                "ms": {label: timing.milliseconds(values) for label, values in seconds.items()},
                "best_uniform": best, "ratio": medians[best] / medians["plan"],
            }
        )  # fmt: skip
        print(
            f"{name:<14} this CPU   b{batch:<4} plan [{_counts(plan)}] "
            + ", ".join(
                f"{label} {1e3 * min(v):.1f}/{1e3 * medians[label]:.1f} ms"
                for label, v in seconds.items()
            )
            + f"  (min/median of {rounds}); plan/best uniform ({best}) {rows[-1]['ratio']:.3f}",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two models, two cards, no CPU rows")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", help="comma-separated model names")
    parser.add_argument(
        "--measured-only", action="store_true", help="only the rows measured on this CPU"
    )
    args = parser.parse_args(argv)
    print(f"host: {host.cpu_model()}, {host.cores()} cores; {host.sixteen_bit_flags()}")
    chosen = workloads()
    if args.only:
        chosen = {name: chosen[name] for name in args.only.split(",")}
    cards = CARDS[::2] if args.quick else CARDS
    if args.quick:
        chosen = dict(list(chosen.items())[:2])
    started = time.perf_counter()
    results: dict[str, Any] = {"host": host.cpu_model(), "predicted": [], "unsafe": []}
    for name, (build, sample, batches) in chosen.items():
        if args.measured_only:
            break
        try:
            results["predicted"] += predicted_rows(name, build, sample, batches, cards)
            results["unsafe"] += unsafe_rows(name, build, sample, batches[-1:])
        except Exception as error:  # noqa: BLE001 - a failing model is reported, not fatal
            results.setdefault("failures", {})[name] = report.failure(error)
            print(f"{name}: failed: {type(error).__name__}: {error}", file=sys.stderr)
    if not args.quick:
        results["measured"] = measured_rows(args.rounds, steps=3)
    worst = min((row["ratio"] for row in results["predicted"]), default=None)
    print(f"worst predicted plan/best uniform: {worst:.3f}" if worst else "no predicted rows")
    print(f"took {time.perf_counter() - started:.0f} s")
    if args.json:
        report.write_json(args.json, results)
    return 0 if not results.get("failures") else 1


if __name__ == "__main__":
    raise SystemExit(main())
