"""Train-step time of float32, mixed_float16, mixed_bfloat16 and an autoprec plan, on one GPU, with JAX.

Measures, side by side in one run, the median training-step time of ResNet50,
a Transformer encoder and MobileNetV2 under Keras' three uniform policies and
under a per-layer plan calibrated on the device itself, then checks an
attention model whose q·k logits overflow float16 (> 65504) while every layer
output stays modest: uniform float16 must go non-finite, the plan must train
finitely. Results go to `results.json` under `$OUT` (or `--out DIR`); a short
table is printed last.

The plan is calibrated here, not predicted, by the library itself:
`autoprec.calibrate` times every computing layer alone in each dtype on the
device (JAX: compiled forward+backward, median after warm-up, identical layers
timed once through its cache) plus casts and, in the full run, whole uniform
steps; `autoprec.heuristic_plan` then gives each layer its cheapest safe dtype
from that table (softmax, normalisation and output layers stay float32). Float16
safety comes from this script's probe: one eager float32 forward pass records
each layer's largest output and, for attention, its largest q·k logit; float16
is unsafe where a value it would hold exceeds 65504/16 (passed to the heuristic
as a duck-typed profile). The results record the plan, the measured costs and
the plan's estimated speedup (`autoprec.estimate`), to compare with the speedup
measured here. Should `autoprec.calibrate` be missing or fail, the script's own
per-layer timing (Conv*, Dense, EinsumDense, DepthwiseConv2D...; ties within 3%
go to bfloat16) makes the plan instead, and `plan_source` says why. The plan
trains through `AutoPrecision` (loss scaling added whenever a layer runs in
float16).

Attention note: Keras' fused `dot_product_attention` on JAX computes logits in
float32 whatever the policy, so q·k only overflows on MultiHeadAttention's
explicit path, which it takes whenever attention dropout is set (the usual
`dropout=0.1` of BERT-style encoders). Both attention models here use it.

Prepare (on the CPU machine, in the repository root; the GPU machine has JAX with
CUDA, numpy, h5py, ml-dtypes, rich, PyYAML, tqdm, packaging and absl-py, but no
TensorFlow, keras, optuna or autoprec, and no network):

    echo /.whl/ >> .git/info/exclude
    python3 -m pip wheel --no-deps -w .whl .
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \\
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
        --platform manylinux1_x86_64 -d .whl \\
        keras==3.15.1 namex optree optuna alembic sqlalchemy colorlog Mako greenlet

Run (device tool `run`, carry `[".whl"]`, timeout_s 540):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; \\
    PYTHONUNBUFFERED=1 KERAS_BACKEND=jax python3 bench/gpu.py --out $OUT

Smoke test on a CPU (tiny stand-in models, 1-2 repeats, under a minute):

    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python bench/gpu.py --smoke --out /tmp/bench
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "jax")
if "--smoke" in sys.argv:
    # Tiny models on a CPU: compile fast rather than run fast.
    os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import autoprec  # noqa: E402
from autoprec.layers import describe_model, layer_paths  # noqa: E402
from autoprec.numerics import exponent_histogram  # noqa: E402

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "autoprec")
DTYPES = ("float32", "bfloat16", "float16")
FLOAT16_MAX = 65504.0
#: float16 is unsafe for a layer whose largest value exceeds this (16x headroom).
FLOAT16_SAFE_MAX = FLOAT16_MAX / 16
#: Measured times closer than this are a tie, resolved towards bfloat16.
TIE_FRACTION = 0.03
COMPUTE_CLASSES = frozenset(
    {
        "Conv1D",
        "Conv2D",
        "Conv3D",
        "Conv1DTranspose",
        "Conv2DTranspose",
        "DepthwiseConv2D",
        "SeparableConv2D",
        "Dense",
        "EinsumDense",
    }
)
FLOAT32_CLASSES = frozenset({"Softmax", "BatchNormalization", "LayerNormalization"})
POLICY_FOR_DTYPE = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


@dataclasses.dataclass
class Settings:
    """How much to measure: full GPU run or CPU smoke run."""

    smoke: bool
    warmup: int
    repeats: int
    steps_per_repeat: int
    layer_repeats: int
    overflow_steps: int
    deadline: float
    #: Whether `autoprec.calibrate` also times whole uniform steps (its step correction).
    calibrate_whole_steps: bool = True


@dataclasses.dataclass
class Workload:
    """One model to benchmark: a builder, one batch of data and the loss."""

    name: str
    build: Callable[[], keras.Model]
    x: np.ndarray
    y: np.ndarray
    loss: str
    note: str = ""


# ------------------------------------------------------------------------------ models


def _resnet50(smoke: bool) -> Workload:
    rng = np.random.default_rng(0)
    if smoke:
        batch, size, classes = 4, 16, 10

        def build() -> keras.Model:
            inputs = keras.Input((size, size, 3))
            x = keras.layers.Conv2D(8, 3, padding="same")(inputs)
            x = keras.layers.BatchNormalization()(x)
            x = keras.layers.Activation("relu")(x)
            shortcut = x
            x = keras.layers.Conv2D(8, 3, padding="same")(x)
            x = keras.layers.BatchNormalization()(x)
            x = keras.layers.Add()([x, shortcut])
            x = keras.layers.Activation("relu")(x)
            x = keras.layers.GlobalAveragePooling2D()(x)
            outputs = keras.layers.Dense(classes, activation="softmax")(x)
            return keras.Model(inputs, outputs, name="resnet_stand_in")

        note = "smoke stand-in: two convolutions with a residual connection"
    else:
        batch, size, classes = 128, 128, 100

        def build() -> keras.Model:
            return keras.applications.ResNet50(
                weights=None, input_shape=(size, size, 3), classes=classes
            )

        note = f"keras.applications.ResNet50, batch {batch}, {size}x{size}"
    x = rng.normal(size=(batch, size, size, 3)).astype("float32")
    y = rng.integers(0, classes, size=(batch,)).astype("int32")
    return Workload("resnet50", build, x, y, "sparse_categorical_crossentropy", note)


def _mobilenetv2(smoke: bool) -> Workload:
    rng = np.random.default_rng(1)
    if smoke:
        batch, size, classes = 4, 16, 10

        def build() -> keras.Model:
            inputs = keras.Input((size, size, 3))
            x = keras.layers.Conv2D(8, 3, strides=2, padding="same")(inputs)
            x = keras.layers.BatchNormalization()(x)
            x = keras.layers.ReLU(6.0)(x)
            x = keras.layers.DepthwiseConv2D(3, padding="same")(x)
            x = keras.layers.BatchNormalization()(x)
            x = keras.layers.Conv2D(16, 1)(x)
            x = keras.layers.GlobalAveragePooling2D()(x)
            outputs = keras.layers.Dense(classes, activation="softmax")(x)
            return keras.Model(inputs, outputs, name="mobilenet_stand_in")

        note = "smoke stand-in: convolution, depthwise and pointwise convolutions"
    else:
        batch, size, classes = 128, 128, 100

        def build() -> keras.Model:
            return keras.applications.MobileNetV2(
                weights=None, input_shape=(size, size, 3), classes=classes
            )

        note = f"keras.applications.MobileNetV2, batch {batch}, {size}x{size}"
    x = rng.normal(size=(batch, size, size, 3)).astype("float32")
    y = rng.integers(0, classes, size=(batch,)).astype("int32")
    return Workload("mobilenetv2", build, x, y, "sparse_categorical_crossentropy", note)


def _encoder_block(x, heads: int, key_dim: int, hidden: int, name: str):
    attended = keras.layers.MultiHeadAttention(
        num_heads=heads, key_dim=key_dim, dropout=0.1, name=f"{name}_attention"
    )(x, x)
    x = keras.layers.LayerNormalization(name=f"{name}_norm_1")(keras.layers.Add()([x, attended]))
    forward = keras.layers.Dense(hidden, activation="gelu", name=f"{name}_ffn_1")(x)
    forward = keras.layers.Dense(x.shape[-1], name=f"{name}_ffn_2")(forward)
    return keras.layers.LayerNormalization(name=f"{name}_norm_2")(keras.layers.Add()([x, forward]))


def _transformer(smoke: bool) -> Workload:
    rng = np.random.default_rng(2)
    if smoke:
        batch, sequence, vocabulary, width, heads, hidden, blocks, classes = (
            4,
            16,
            50,
            16,
            2,
            32,
            1,
            4,
        )
    else:
        batch, sequence, vocabulary, width, heads, hidden, blocks, classes = (
            64, 256, 8000, 512, 8, 2048, 4, 10,
        )  # fmt: skip

    def build() -> keras.Model:
        tokens = keras.Input((sequence,), dtype="int32")
        x = keras.layers.Embedding(vocabulary, width, name="embedding")(tokens)
        for index in range(blocks):
            x = _encoder_block(x, heads, width // heads, hidden, f"block_{index}")
        x = keras.layers.GlobalAveragePooling1D()(x)
        outputs = keras.layers.Dense(classes, activation="softmax", name="head")(x)
        return keras.Model(tokens, outputs, name="transformer_encoder")

    x = rng.integers(0, vocabulary, size=(batch, sequence)).astype("int32")
    y = rng.integers(0, classes, size=(batch,)).astype("int32")
    note = (
        f"{blocks} encoder blocks, width {width}, {heads} heads, sequence {sequence}, "
        f"batch {batch}, attention dropout 0.1"
    )
    return Workload("transformer", build, x, y, "sparse_categorical_crossentropy", note)


def _attention_overflow(smoke: bool) -> Workload:
    """Query/key kernels of 1/features on inputs of ~300: q, k ~ 300 but q·k/sqrt(d) ~ 3e5."""
    rng = np.random.default_rng(3)
    batch, sequence, features, heads = (4, 8, 16, 2) if smoke else (32, 256, 64, 4)

    def build() -> keras.Model:
        inputs = keras.Input((sequence, features))
        attention = keras.layers.MultiHeadAttention(
            num_heads=heads, key_dim=features, dropout=0.1, name="attention"
        )
        x = attention(inputs, inputs)
        x = keras.layers.LayerNormalization(name="norm")(x)
        x = keras.layers.GlobalAveragePooling1D()(x)
        outputs = keras.layers.Dense(1, name="head")(x)
        model = keras.Model(inputs, outputs, name="attention_overflow")
        for dense in (attention._query_dense, attention._key_dense):
            dense.kernel.assign(np.full(dense.kernel.shape, 1.0 / features, "float32"))
        return model

    x = (rng.uniform(0.5, 1.5, size=(batch, sequence, features)) * 300).astype("float32")
    y = rng.normal(size=(batch, 1)).astype("float32")
    note = "q, k ~ 300 per element, q·k/sqrt(d) ~ 1e5 > 65504; layer outputs modest"
    return Workload("attention_overflow", build, x, y, "mse", note)


def workloads(smoke: bool, names: list[str] | None = None) -> list[Workload]:
    """Returns the workloads to run, in order."""
    builders = {
        "resnet50": _resnet50,
        "transformer": _transformer,
        "mobilenetv2": _mobilenetv2,
        "attention_overflow": _attention_overflow,
    }
    chosen = names or list(builders)
    return [builders[name](smoke) for name in chosen]


# ------------------------------------------------------------------------------ timing


def _state(model: keras.Model) -> tuple:
    """The JAX trainer's state tuple, in the order `model.train_function` takes it."""
    return (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in model.optimizer.variables],
        [v.value for v in model.metrics_variables],
    )


def _loss_scale_index(model: keras.Model) -> int | None:
    optimizer = model.optimizer
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return None
    ids = [id(variable) for variable in optimizer.variables]
    return ids.index(id(optimizer.dynamic_scale))


def time_train_steps(model: keras.Model, x: np.ndarray, y: np.ndarray, settings: Settings) -> dict:
    """Times the model's own compiled train step on device-resident data.

    `fit` has already run one step (building the optimizer and compiling the step);
    the same compiled function is then called directly, so no host data pipeline
    is timed. Each repeat runs `steps_per_repeat` steps and waits for the device
    (`jax.block_until_ready`).

    Returns:
        `{"step_seconds": median, "repeat_seconds": [...], "final_loss", "finite",
        "loss_scale"}`.
    """
    data = (jnp.asarray(x), jnp.asarray(y))
    state = _state(model)
    scale_index = _loss_scale_index(model)
    logs = None
    started = time.perf_counter()
    for _ in range(settings.warmup):
        logs, state = model.train_function(state, iter([data]))
    jax.block_until_ready(state)
    warmup_seconds = time.perf_counter() - started
    per_step = []
    for _ in range(settings.repeats):
        started = time.perf_counter()
        for _ in range(settings.steps_per_repeat):
            logs, state = model.train_function(state, iter([data]))
        jax.block_until_ready((logs, state))
        per_step.append((time.perf_counter() - started) / settings.steps_per_repeat)
    final_loss = float(np.asarray(logs["loss"]))
    weights_finite = all(bool(jnp.isfinite(value).all()) for value in state[0])
    return {
        "step_seconds": statistics.median(per_step),
        "warmup_seconds": warmup_seconds,
        "repeat_seconds": per_step,
        "final_loss": final_loss,
        "finite": bool(np.isfinite(final_loss) and weights_finite),
        "loss_scale": float(np.asarray(state[2][scale_index])) if scale_index is not None else None,
    }


def _compile(model: keras.Model, workload: Workload, smoke: bool) -> keras.Model:
    # SGD in the smoke run only: its smaller step compiles faster on a CPU.
    optimizer = keras.optimizers.SGD(1e-4) if smoke else keras.optimizers.Adam(1e-4)
    model.compile(optimizer=optimizer, loss=workload.loss)
    return model


def _build(workload: Workload, policy: str, smoke: bool) -> keras.Model:
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy(policy if policy != "autoprec" else "float32")
    try:
        return _compile(workload.build(), workload, smoke)
    finally:
        keras.config.set_dtype_policy("float32")


# ------------------------------------------------------------------------------ calibration


def _float_arrays(value: Any) -> list:
    arrays = [item for item in jax.tree_util.tree_leaves(value) if hasattr(item, "dtype")]
    return [item for item in arrays if jnp.issubdtype(item.dtype, jnp.floating)]


def probe_layers(model: keras.Model, x: np.ndarray) -> dict[str, dict]:
    """Runs one float32 forward pass eagerly, recording each layer's input shape and largest |value|.

    Returns:
        `{path: {"class", "input_shape", "output_amax", "logits_amax"}}`; `logits_amax`
        only for `MultiHeadAttention` (largest scaled q·k logit).
    """
    records: dict[str, dict] = {}
    patched = []
    for path, layer in layer_paths(model).items():
        record = {"class": type(layer).__name__, "input_shape": None, "output_amax": 0.0}
        records[path] = record
        original_call = layer.call

        def call(*args, _original=original_call, _record=record, **kwargs):
            if args and hasattr(args[0], "shape") and _record["input_shape"] is None:
                _record["input_shape"] = list(args[0].shape)
            outputs = _original(*args, **kwargs)
            for array in _float_arrays(outputs):
                _record["output_amax"] = max(_record["output_amax"], float(jnp.abs(array).max()))
            return outputs

        layer.call = call
        patched.append(layer)
        if isinstance(layer, keras.layers.MultiHeadAttention):
            patched_attention = _probe_attention(layer, record)
            layer._compute_attention = patched_attention
    try:
        model(x, training=False)
    finally:
        for layer in patched:
            layer.__dict__.pop("call", None)
            layer.__dict__.pop("_compute_attention", None)
    return records


def _probe_attention(layer: keras.layers.MultiHeadAttention, record: dict) -> Callable:
    original = layer._compute_attention

    def compute_attention(query, key, value, *args, **kwargs):
        scaled = query * layer._inverse_sqrt_key_dim
        logits = keras.ops.einsum(layer._dot_product_equation, key, scaled)
        record["logits_amax"] = max(record.get("logits_amax", 0.0), float(jnp.abs(logits).max()))
        return original(query, key, value, *args, **kwargs)

    return compute_attention


def _layer_signature(layer: keras.layers.Layer, input_shape: list[int]) -> str:
    config = dict(layer.get_config())
    config.pop("name", None)
    config.pop("dtype", None)
    return json.dumps([type(layer).__name__, config, input_shape], sort_keys=True, default=str)


def _takes_training(layer: keras.layers.Layer) -> bool:
    return "training" in getattr(layer, "_call_signature_parameters", ())


def layer_seconds(
    layer: keras.layers.Layer, input_shape: list[int], dtype: str, repeats: int, warmup: int = 2
) -> float:
    """Times one layer's compiled forward+backward, rebuilt alone in `dtype`, on the device."""
    config = dict(layer.get_config())
    config["dtype"] = POLICY_FOR_DTYPE[dtype]
    clone = type(layer).from_config(config)
    clone.build(tuple(input_shape))
    trainable = [v.value for v in clone.trainable_variables]
    inputs = jax.random.normal(jax.random.PRNGKey(0), input_shape, "float32").astype(dtype)

    def objective(weights, values):
        # `__call__` (not `stateless_call`) so the layer autocasts its float32 kernels.
        mapping = list(zip(clone.trainable_variables, weights))
        with keras.StatelessScope(state_mapping=mapping):
            outputs = clone(values, training=True) if _takes_training(clone) else clone(values)
        return jnp.sum(outputs.astype("float32"))

    gradient = jax.jit(jax.grad(objective, argnums=(0, 1)))
    for _ in range(warmup):
        jax.block_until_ready(gradient(trainable, inputs))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(gradient(trainable, inputs))
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _safe_dtypes(path: str, record: dict, probes: dict[str, dict]) -> list[str]:
    values = [record["output_amax"]]
    parent = path.rsplit("/", 1)[0] if "/" in path else None
    if parent and path.rsplit("/", 1)[1] in ("query_dense", "key_dense"):
        values.append(probes.get(parent, {}).get("logits_amax", 0.0))
    if max(values) > FLOAT16_SAFE_MAX:
        return ["float32", "bfloat16"]
    return ["float32", "bfloat16", "float16"]


def _fastest(seconds: dict[str, float]) -> str:
    best = min(seconds, key=seconds.get)
    if best != "bfloat16" and "bfloat16" in seconds:
        if seconds["bfloat16"] <= seconds[best] * (1 + TIE_FRACTION):
            return "bfloat16"
    return best


def _stats_of(value: float) -> autoprec.TensorStats:
    """One recorded magnitude as the profiler's statistics of a tensor."""
    histogram, zeros, nonfinite = exponent_histogram([value])
    return autoprec.TensorStats(
        count=1,
        zeros=zeros,
        nonfinite=nonfinite,
        max_abs=float(value),
        min_nonzero_abs=float(value) or None,
        sum_abs=float(value),
        sum_squares=float(value) ** 2,
        histogram=histogram,
    )


def _float16_feasibility(probes: dict[str, dict], model: keras.Model) -> autoprec.Profile:
    """Returns the probe's float16 verdicts as the `autoprec.Profile` `heuristic_plan` reads.

    The JAX backend has no autoprec profiler, so the probe of this script stands in:
    each layer's largest output (or attention logit) becomes its recorded activation.
    """
    infos = describe_model(model)
    layers = {}
    for path, record in probes.items():
        largest = max(record["output_amax"], record.get("logits_amax", 0.0))
        if "float16" not in _safe_dtypes(path, record, probes):
            largest = max(largest, 2 * FLOAT16_MAX)
        info = infos.get(path)
        layers[path] = autoprec.LayerProfile(
            path=path,
            class_name=info.class_name if info is not None else "Layer",
            dtype="float32",
            activations={"output": _stats_of(largest)},
            activation_gradients={},
            weights={},
            weight_gradients={},
            internals={},
        )
    return autoprec.Profile(layers, steps=1, model_name=model.name)


def library_plan(
    model: keras.Model, workload: Workload, settings: Settings
) -> tuple[autoprec.PrecisionPlan | None, dict]:
    """Returns a plan from `autoprec.calibrate` + `autoprec.heuristic_plan`, and its evidence.

    Returns `(None, {"reason": ...})` when the library cannot calibrate here.
    """
    calibrate = getattr(autoprec, "calibrate", None)
    heuristic = getattr(autoprec, "heuristic_plan", None)
    if calibrate is None or heuristic is None:
        return None, {"reason": "autoprec.calibrate or autoprec.heuristic_plan does not exist"}
    probes = probe_layers(model, workload.x)
    hardware = autoprec.hardware.detect()
    try:
        with tempfile.TemporaryDirectory() as cache_dir:
            costs = calibrate(
                model,
                (workload.x, workload.y),
                dtypes=DTYPES,
                repeats=max(settings.layer_repeats, 2),
                cache_dir=cache_dir,
                verbose=0,
                measure_model_step=settings.calibrate_whole_steps,
                hardware=hardware,
            )
    except Exception as error:  # noqa: BLE001 - the bench's own timing takes over
        return None, {
            "reason": f"autoprec.calibrate: {type(error).__name__}: {error}",
            "traceback": traceback.format_exc()[-3000:],
        }
    feasibility = _float16_feasibility(probes, model)
    plan = heuristic(model, profile=feasibility, costs=costs, hardware=hardware, dtypes=DTYPES)
    estimate = autoprec.estimate(model, plan, costs=costs)
    infos = describe_model(model)
    layers = {
        path: {
            "seconds": record.seconds,
            "source": record.source,
            "float16_safe": (
                feasibility.layers[path].float16_safe if path in feasibility.layers else None
            ),
            "output_amax": probes.get(path, {}).get("output_amax"),
        }
        for path, record in costs.layers.items()
        if infos.get(path) is not None and infos[path].class_name in COMPUTE_CLASSES
    }
    return plan, {
        "source": "autoprec.calibrate + autoprec.heuristic_plan",
        "hardware": hardware.name,
        "layers": layers,
        "distinct_layers_timed": sum(
            record.source == "measured" for record in costs.layers.values()
        ),
        "calibrate_stats": costs.stats,
        "measured_step_seconds_by_dtype": costs.measured_step_seconds_by_dtype,
        "step_overhead_seconds": costs.step_overhead_seconds,
        "estimated_step_seconds": estimate.step_seconds,
        "estimated_speedup": estimate.speedup,
        "costs_summary": costs.summary(limit=60),
        "attention_logits_amax": {
            path: record["logits_amax"]
            for path, record in probes.items()
            if "logits_amax" in record
        },
    }


def calibrated_plan(
    model: keras.Model, x: np.ndarray, settings: Settings
) -> tuple[autoprec.PrecisionPlan, dict]:
    """Returns a plan from per-layer timings on this device, and the evidence behind it."""
    infos = describe_model(model)
    paths = layer_paths(model)
    probes = probe_layers(model, x)
    outputs = set(_output_paths(model))
    timed_by_signature: dict[str, dict[str, float]] = {}
    choices: dict[str, str] = {}
    evidence: dict[str, dict] = {}
    for path, info in infos.items():
        layer, record = paths[path], probes[path]
        if info.class_name not in COMPUTE_CLASSES or record["input_shape"] is None:
            continue
        if path in outputs or time.monotonic() > settings.deadline:
            continue
        safe = _safe_dtypes(path, record, probes)
        signature = _layer_signature(layer, record["input_shape"])
        if signature not in timed_by_signature:
            timed_by_signature[signature] = {
                dtype: layer_seconds(
                    layer, record["input_shape"], dtype, settings.layer_repeats, settings.warmup
                )
                for dtype in ("float32", "bfloat16", "float16")
            }
        seconds = timed_by_signature[signature]
        choices[path] = _fastest({dtype: seconds[dtype] for dtype in safe})
        evidence[path] = {"seconds": seconds, "safe": safe, "output_amax": record["output_amax"]}
    plan = _assemble_plan(model, infos, probes, choices)
    return plan, {
        "layers": evidence,
        "distinct_layers_timed": len(timed_by_signature),
        "attention_logits_amax": {
            path: record["logits_amax"]
            for path, record in probes.items()
            if "logits_amax" in record
        },
    }


def _assemble_plan(model, infos, probes, choices: dict[str, str]) -> autoprec.PrecisionPlan:
    sixteen = [dtype for dtype in choices.values() if dtype != "float32"]
    common = max(set(sixteen), key=sixteen.count) if sixteen else "float32"
    if any(record.get("logits_amax", 0.0) > FLOAT16_SAFE_MAX for record in probes.values()):
        common = "bfloat16" if common == "float16" else common
    plan = autoprec.PrecisionPlan.uniform(model, common)
    # Containers first: an exact path also sets the layers under it.
    for path in sorted(infos, key=lambda p: p.count("/")):
        info = infos[path]
        if info.class_name in FLOAT32_CLASSES:
            plan = plan.with_dtype(path, "float32")
        elif path in choices:
            plan = plan.with_dtype(path, choices[path])
        elif info.class_name == "MultiHeadAttention":
            unsafe = probes[path].get("logits_amax", 0.0) > FLOAT16_SAFE_MAX
            plan = plan.with_dtype(path, "bfloat16" if unsafe and common == "float16" else common)
    for path in _output_paths(model):
        plan = plan.with_dtype(path, "float32")
    return plan


def _output_paths(model: keras.Model) -> list[str]:
    by_layer = {id(layer): path for path, layer in layer_paths(model).items()}
    found = []
    for output in model.outputs:
        history = getattr(output, "_keras_history", None)
        if history is not None and id(history.operation) in by_layer:
            found.append(by_layer[id(history.operation)])
    return found


# ------------------------------------------------------------------------------ running


def run_policy(workload: Workload, policy: str, settings: Settings) -> dict:
    """Builds, compiles and times one workload under one policy."""
    model = _build(workload, policy, settings.smoke)
    result: dict[str, Any] = {}
    callbacks = []
    if policy == "autoprec":
        started = time.perf_counter()
        plan, evidence = library_plan(model, workload, settings)
        result["plan_source"] = evidence.get("source")
        result["calibrate_fallback_reason"] = None
        if plan is None:
            result["calibrate_fallback_reason"] = evidence["reason"]
            result["plan_source"] = "bench fallback: own per-layer timing"
            plan, evidence = calibrated_plan(model, workload.x, settings)
        result["calibration_seconds"] = time.perf_counter() - started
        result["plan_dtype_counts"] = plan.dtype_counts()
        result["plan"] = json.loads(plan.to_json())
        result["evidence"] = evidence
        callbacks = [autoprec.AutoPrecision(plan, verbose=0)]
    started = time.perf_counter()
    batch = len(workload.x)
    model.fit(
        workload.x, workload.y, batch_size=batch, epochs=1, verbose=0, callbacks=callbacks
    )  # fmt: skip
    result["first_step_seconds"] = time.perf_counter() - started
    result.update(time_train_steps(model, workload.x, workload.y, settings))
    result["optimizer"] = type(model.optimizer).__name__
    return result


def run_workload(workload: Workload, settings: Settings) -> dict:
    """Runs every policy on one workload; a policy that fails is recorded with its error."""
    entry: dict[str, Any] = {"note": workload.note, "batch_size": len(workload.x), "policies": {}}
    overflow = workload.name == "attention_overflow"
    for policy in POLICIES:
        if time.monotonic() > settings.deadline:
            entry["policies"][policy] = {"error": "skipped: time budget spent"}
            continue
        run_settings = (
            dataclasses.replace(settings, repeats=1, steps_per_repeat=settings.overflow_steps)
            if overflow
            else settings
        )
        try:
            entry["policies"][policy] = run_policy(workload, policy, run_settings)
        except Exception as error:  # noqa: BLE001 - one failure must not lose the others
            entry["policies"][policy] = {
                "error": f"{type(error).__name__}: {error}",
                "traceback": traceback.format_exc()[-3000:],
            }
        print(f"  {workload.name:<20} {policy:<15} {_cell(entry['policies'][policy])}", flush=True)
    return entry


def environment() -> dict:
    """Versions and devices this run measured with."""
    return {
        "keras_backend": keras.backend.backend(),
        "keras": keras.__version__,
        "jax": jax.__version__,
        "autoprec": autoprec.__version__,
        "devices": [str(device) for device in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,
        "tensorflow_imported": sys.modules.get("tensorflow") is not None,
        "python": sys.version.split()[0],
    }


def _cell(result: dict) -> str:
    if "error" in result:
        return "error"
    finite = "" if result["finite"] else " NaN"
    return f"{result['step_seconds'] * 1e3:8.2f} ms{finite}"


def table(results: dict) -> str:
    """Returns the short results table: ms per step, speedup over float32, finiteness."""
    lines = [f"{'model':<20}" + "".join(f"{policy:>17}" for policy in POLICIES)]
    for name, entry in results["models"].items():
        cells = [_cell(entry["policies"].get(policy, {"error": "missing"})) for policy in POLICIES]
        lines.append(f"{name:<20}" + "".join(f"{cell:>17}" for cell in cells))
        base = entry["policies"].get("float32", {}).get("step_seconds")
        if base:
            ratios = []
            for policy in POLICIES:
                seconds = entry["policies"].get(policy, {}).get("step_seconds")
                ratios.append(f"x{base / seconds:.2f}" if seconds else "-")
            lines.append(f"{'  speedup':<20}" + "".join(f"{ratio:>17}" for ratio in ratios))
    return "\n".join(lines)


def _settings(args: argparse.Namespace, started: float) -> Settings:
    if args.smoke:
        return Settings(True, 1, 2, 1, 1, 3, started + args.budget_seconds, False)
    return Settings(False, 3, 10, 5, 5, 20, started + args.budget_seconds, True)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny models on a CPU, < 60 s")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_out"), help="results folder")
    parser.add_argument("--models", default=None, help="comma-separated subset of the workloads")
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=400.0,
        help="stop starting new measurements after this long (results so far are kept)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; writes `results.json` and prints the table. Returns the exit status."""
    started = time.monotonic()
    args = _parse_args(argv)
    if keras.backend.backend() != "jax":
        print(f"bench/gpu.py runs on KERAS_BACKEND=jax, not {keras.backend.backend()!r}")
        return 2
    settings = _settings(args, started)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"environment": environment(), "smoke": args.smoke, "models": {}}
    print(json.dumps(results["environment"]), flush=True)
    names = args.models.split(",") if args.models else None
    for workload in workloads(args.smoke, names):
        results["models"][workload.name] = run_workload(workload, settings)
        results["elapsed_seconds"] = time.monotonic() - started
        (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    results["environment"]["tensorflow_imported_at_end"] = sys.modules.get("tensorflow") is not None
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\nresults: {out_dir / 'results.json'}  ({results['elapsed_seconds']:.0f} s)")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
