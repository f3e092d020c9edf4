"""The GPU benchmark's memory process (`bench/gpu.py --memory-child`): bytes, peaks, largest batch.

Started at the end of the run, in a process of its own: the device's high-water mark
starts fresh there, and running out of memory cannot harm the timing process. Each
candidate's train step (`jax.jit(model.train_step, donate_argnums=0)`, the function
Keras compiles) is compiled at the timed batch size; the steps then run once each in
ascending order of XLA's bytes, so each raises the high-water mark; the largest batch
that fits is searched last (doubling, then bisection).
"""

from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gpu_workloads as gpu
import jax
import jax.numpy as jnp
import keras
import numpy as np
from common.keras_tools import Workload
from common.report import failure, write_json

import autoprec

#: The benchmark's script, which the memory process runs.
GPU_SCRIPT = Path(__file__).resolve().with_name("gpu.py")


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
    if candidate in gpu.UNIFORM:
        return gpu.build_uniform(workload, candidate, weights)
    plan = autoprec.PrecisionPlan.load(plan_path)
    return gpu.build_planned(workload, plan, weights, workload.data(0, 1)[0])


def measure_memory(request: dict[str, Any]) -> dict[str, Any]:
    """The memory process: every candidate's step bytes, peak and largest batch.

    All candidates of all models are compiled first; their steps then run once each,
    in ascending order of XLA's bytes, so each step raises the device's high-water mark
    to its own peak; the largest-batch searches come last, each given an equal share of
    the time left.
    """
    settings = gpu.settings_for(request["smoke"])
    known = gpu.workloads(request["smoke"])
    end = time.monotonic() + request["seconds"]
    results: dict[str, dict[str, Any]] = {}
    probes: dict[tuple[str, str], MemoryProbe] = {}
    keras.backend.clear_session()
    for name, plan_paths in request["models"].items():
        workload, results[name] = known[name], {}
        x, y = workload.data(0, workload.batch_size)
        weights = gpu.build_uniform(workload, "float32", None).get_weights()
        for candidate in gpu.CANDIDATES:
            if candidate in gpu.PLANS and candidate not in plan_paths:
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
    settings: gpu.Settings,
    plan_paths: dict[str, dict[str, str]],
    seconds: float,
    hard_end: float,
    folder: Path,
) -> dict[str, Any]:
    """Runs the memory process (`bench/gpu.py --memory-child`); returns what it wrote.

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
    command = [sys.executable, str(GPU_SCRIPT), "--memory-child", str(request_path)]
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
        for candidate in gpu.CANDIDATES:
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
