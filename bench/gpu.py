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

The parts: this script (the run, each model's candidates, timing), `gpu_workloads.py`
(settings, models, building candidates), `gpu_memory.py` (the memory process),
`gpu_overflow.py` (the overflow check), `gpu_report.py` (host and table), and what
every benchmark shares in `common/` (timing rounds, host, JSON, model builders, data):
none of them imports TensorFlow.

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
import dataclasses
import gc
import json
import math
import os
import sys
import tempfile
import time
import warnings
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

import autoprec  # noqa: E402
from autoprec.search import output_layers  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/, for its shared `common`
from common.keras_tools import (  # noqa: E402
    Workload,
    captured_messages,
    plan_report,
    search_val_loss,
    train_step,
)
from common.report import failure, write_json  # noqa: E402
from common.timing import fastest, milliseconds, ratios_to, time_steps  # noqa: E402
from gpu_memory import measure_memory, memory_stats, run_memory_process  # noqa: E402
from gpu_overflow import overflow_check  # noqa: E402
from gpu_report import host, table  # noqa: E402
from gpu_workloads import (  # noqa: E402
    CANDIDATES,
    PLANS,
    UNIFORM,
    Settings,
    build_planned,
    build_uniform,
    composition,
    settings_for,
    stage,
    workloads,
)

#: Words of `plan.metadata` keys kept as the plan's own report.
REPORT_WORDS = ("measur", "predict", "candidate", "timing", "timed", "chose", "winner")
#: Seconds kept aside for the attention-overflow check and for the memory process
#: (by smoke run or not); the models share the rest.
OVERFLOW_RESERVE = {True: 10.0, False: 30.0}
MEMORY_RESERVE = {True: 15.0, False: 100.0}
#: Seconds past the budget after which the memory process is stopped.
HARD_END_SECONDS = 50.0

# ---------------------------------------------------------------------- timing


def compare(candidates: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The best uniform policy (by min and by median) and each plan's ratio to it.

    A plan without figures (it failed) has ratio `None`, and so has every plan when no
    uniform policy was timed.
    """
    best = fastest(candidates, UNIFORM)
    ratios: dict[str, Any] = {}
    for name in PLANS:
        figures = candidates.get(name, {})
        timed = "ms_min" in figures and best["min"] is not None
        ratios[name] = ratios_to(figures, candidates, best) if timed else None
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
                result = search_val_loss(
                    models["float32"],
                    (x, y),
                    (x_val, y_val),
                    hardware=hardware,
                    trials=settings.trials,
                    batch_size=batch,
                    steps_per_trial=settings.trial_steps,
                    baseline=workload.search_baseline,
                    timeout=info["timeout"],
                    confirm_steps=settings.confirm_steps,
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

        def record(name: str, error: Exception) -> None:
            failures[name] = failure(error)  # the other candidates are still timed

        samples, losses = time_steps(steps, settings.rounds, settings.steps, record)
        for name, values in samples.items():
            row["candidates"][name] = {
                **milliseconds(values),
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
        "report": plan_report(metadata, REPORT_WORDS),
        "metadata_keys": sorted(str(key) for key in metadata),
        "plan": json.loads(plan.to_json()),
    }


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
