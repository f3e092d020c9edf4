"""The GPU benchmark's settings, models and candidates (`bench/gpu.py`), on JAX.

Imported by `bench/gpu.py` once it has set up the environment (the JAX backend,
TensorFlow blocked where asked): no TensorFlow here, no Optuna.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import keras
from common import data
from common.data import seeded
from common.keras_tools import Workload, fresh_copy
from common.models import decoder_lm, encoder_classifier, resnet
from common.report import failure

import autoprec

UNIFORM = ("float32", "mixed_bfloat16", "mixed_float16")
#: `"float8"`: float8 on every Dense/EinsumDense layer but the output layers, bfloat16
#: elsewhere (`float8_from_mixed_bfloat16`), timed against the uniform policies.
PLANS = ("one-liner", "search", "float8")
CANDIDATES = UNIFORM + PLANS

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


def workloads(smoke: bool) -> dict[str, Workload]:
    """The benchmark's three models, at GPU size or as small CPU stand-ins.

    The smoke run's decoder and CNN are just large enough for the predicted RTX 2060
    profile to give them float16 layers (a plan with loss scaling to apply and time).
    """
    if smoke:
        encoder = dict(length=16, vocabulary=64, width=32, heads=2, hidden=64, blocks=1)
        decoder = dict(length=32, vocabulary=512, width=128, heads=2, hidden=512, blocks=1)
        token_batches = {"transformer": 8, "gpt": 16}
        size, widths, cnn_batch = 32, (16, 32), 16
    else:
        encoder = dict(length=256, vocabulary=8192, width=768, heads=12, hidden=3072, blocks=2)
        decoder = encoder
        token_batches = {"transformer": 64, "gpt": 64}
        size, widths, cnn_batch = 64, (64, 128, 256, 512), 128

    def shape(dims: dict[str, int]) -> str:
        return (
            f"{dims['blocks']} blocks, width {dims['width']}, {dims['heads']} heads, "
            f"sequence {dims['length']}"
        )

    found = [
        Workload(
            "transformer",
            f"BERT-style encoder ({shape(encoder)}, attention dropout 0.1), "
            f"batch {token_batches['transformer']}",
            lambda: encoder_classifier(**encoder, dropout=0.1, name="transformer_encoder"),
            seeded(data.marker_tokens, encoder["length"], encoder["vocabulary"]),
            token_batches["transformer"],
        ),
        Workload(
            "gpt",
            f"GPT-style causal decoder ({shape(decoder)}, vocabulary {decoder['vocabulary']}), "
            f"batch {token_batches['gpt']}",
            lambda: decoder_lm(**decoder, dropout=0.1, epsilon=1e-5, name="gpt_decoder"),
            seeded(data.next_tokens, decoder["length"], decoder["vocabulary"]),
            token_batches["gpt"],
            logits=True,
        ),
        Workload(
            "resnet",
            f"ResNet-style CNN ({len(widths)} stages {'/'.join(map(str, widths))}, "
            f"{size}x{size}), batch {cnn_batch}",
            lambda: resnet(size, widths, use_bias=False, normalize_projection=True),
            seeded(data.offset_images, size),
            cnn_batch,
            search_baseline=None,
        ),
    ]
    return {workload.name: workload for workload in found}


# ---------------------------------------------------------------------- building candidates


def build_uniform(workload: Workload, policy: str, weights: list | None) -> keras.Model:
    """The model built and compiled under Keras' global `policy`, with `weights` if given."""
    # under mixed_float16 Keras adds its LossScaleOptimizer
    return fresh_copy(workload.build, weights, policy, workload.compile)


def build_planned(
    workload: Workload, plan: autoprec.PrecisionPlan, weights: list | None, x_sample: Any
) -> keras.Model:
    """A float32 copy with `plan` applied (`autoprec.apply_plan`), compiled alike.

    A plan with float16 layers gets Keras' `LossScaleOptimizer`, as Keras gives
    `mixed_float16`.
    """
    model = fresh_copy(workload.build, weights)
    autoprec.apply_plan(model, plan, x=x_sample)
    workload.compile(model, loss_scale=plan.uses_float16)
    return model


def composition(plan: autoprec.PrecisionPlan) -> dict[str, int]:
    """Layers of a plan per compute dtype."""
    return dict(sorted(plan.dtype_counts().items()))


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
