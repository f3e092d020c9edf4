"""The GPU benchmark's attention-overflow check (`bench/gpu.py`).

An attention model whose q·k logits overflow float16 (> 65504) while every layer
output stays modest. Uniform `mixed_float16` must go non-finite; the one-liner's plan
(decided by `AutoPrecision()` on that model, then trained through
`AutoPrecision(plan)`, guard on) must train finitely. Keras' fused
`dot_product_attention` on JAX computes logits in float32 whatever the policy, so q·k
only overflows on MultiHeadAttention's explicit path, which it takes whenever attention
dropout is set.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
from common.keras_tools import Workload
from gpu_workloads import UNIFORM, Settings, build_uniform, composition, stage

import autoprec

FLOAT16_MAX = 65504.0


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
