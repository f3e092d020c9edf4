"""`bench/gpu.py --smoke`: the prepared GPU benchmark runs end to end on a CPU, with JAX and no TensorFlow.

One smoke run (small stand-in models, real training, real Optuna search, a real memory
process) is checked for the structure of its `results.json`: every model has every
candidate's timing or a recorded failure, the plans' ratios to the best uniform
policy, the memory figures of every candidate, the attention-overflow check. Timings
are never asserted. The largest-batch search and the comparison are also checked
alone on known answers.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu.py"
_MODELS = ("transformer", "gpt", "resnet")
_UNIFORM = ("float32", "mixed_bfloat16", "mixed_float16")
_PLANS = ("one-liner", "search", "float8")
_CANDIDATES = _UNIFORM + _PLANS
_BOUNDS = ("oom", "cap", "time")


def _strict_json(text: str) -> dict:
    def refuse(constant: str):
        raise ValueError(f"results.json holds {constant}: not strict JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[str, dict]:
    """Runs the smoke benchmark once; returns its stdout and its results JSON."""
    pytest.importorskip("jax", reason="jax is not installed: pip install 'jax[cpu]'")
    out_dir = tmp_path_factory.mktemp("bench")
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="3",
        # As on the GPU machine: TensorFlow cannot be imported (the memory process too).
        BENCH_GPU_BLOCK_TENSORFLOW="1",
    )
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    completed = subprocess.run(
        [sys.executable, str(_SCRIPT), "--smoke", "--out", str(out_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return completed.stdout, _strict_json((out_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def bench():
    """The script as a module (its functions alone, no run)."""
    spec = importlib.util.spec_from_file_location("bench_gpu", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def memory(bench):
    """`bench/gpu_memory.py`, the memory process's part of the script, as `bench/gpu.py` imports it."""
    return sys.modules["gpu_memory"]


def _record(results: dict, model: str) -> dict:
    row = results["models"][model]
    assert "error" not in row, row.get("traceback", row["error"])
    return row


def test_runs_on_jax_without_tensorflow_and_prints_the_table(smoke):
    stdout, results = smoke
    environment = results["environment"]
    assert environment["keras_backend"] == "jax"
    assert environment["tensorflow_imported"] is False
    assert environment["tensorflow_imported_at_end"] is False
    assert results["smoke"] is True and results["settings"]["rounds"] >= 1
    table = stdout[stdout.index("results: ") :]
    for model in _MODELS:
        assert any(line.split()[:2] == [model, "float32"] for line in table.splitlines()), table
    assert "attention overflow" in table and "best uniform" in table


@pytest.mark.parametrize("model", _MODELS)
def test_every_candidate_is_timed_or_its_failure_recorded(smoke, model):
    results = smoke[1]
    row = _record(results, model)
    rounds = results["settings"]["rounds"]
    assert set(row["candidates"]) == set(_CANDIDATES)
    for name, figures in row["candidates"].items():
        if "error" in figures:
            assert name in _PLANS, f"{model}/{name}: {figures.get('traceback', figures)}"
            assert figures["error"]
            continue
        assert 0 < figures["ms_min"] <= figures["ms_median"]
        assert len(figures["rounds_ms"]) == rounds
        assert min(figures["rounds_ms"]) == pytest.approx(figures["ms_min"])
        assert isinstance(figures["finite"], bool)
    assert row["candidates"]["float32"]["optimizer"] == "Adam"
    # As Keras compiles mixed_float16: its LossScaleOptimizer.
    assert row["candidates"]["mixed_float16"]["optimizer"] == "LossScaleOptimizer"
    for stage, entry in row["stages"].items():
        assert entry["seconds"] >= 0, stage
        if "error" in entry and not entry["error"].startswith("skipped"):
            assert entry["traceback"], stage


@pytest.mark.parametrize("model", _MODELS)
def test_ratios_compare_each_plan_with_the_best_uniform_policy(smoke, model):
    row = _record(smoke[1], model)
    candidates = row["candidates"]
    assert set(row["ratios"]) == set(_PLANS)
    for statistic in ("min", "median"):
        best = row["best_uniform"][statistic]
        assert best in _UNIFORM
        fastest = min(candidates[name][f"ms_{statistic}"] for name in _UNIFORM)
        assert candidates[best][f"ms_{statistic}"] == fastest
        for plan in _PLANS:
            ratio = row["ratios"][plan]
            if "error" in candidates[plan]:
                assert ratio is None
                continue
            expected = candidates[plan][f"ms_{statistic}"] / fastest
            assert ratio[statistic] == pytest.approx(expected)


@pytest.mark.parametrize("model", _MODELS)
def test_every_candidate_has_memory_figures_or_a_recorded_failure(smoke, model):
    results = smoke[1]
    row = _record(results, model)
    assert results["memory_process"]["status"] == 0, results["memory_process"]["output_tail"]
    assert set(row["memory"]) == set(_CANDIDATES)
    for name, memory in row["memory"].items():
        if "error" in memory:
            assert "error" in row["candidates"][name], f"{model}/{name}: {memory}"
            continue
        assert memory["xla_bytes"] > 0 and memory["state_bytes"] > 0
        # A CPU keeps no memory statistics: the runtime figures are None, not guessed.
        for key in ("peak_bytes_in_use", "step_bytes", "peak_bytes", "bytes_limit"):
            assert key in memory and memory[key] is None, (name, key, memory[key])
        assert memory["max_batch_bound"] in _BOUNDS
        assert row["batch_size"] <= memory["max_batch"] <= memory["cap"]
        for probe in memory["probes"]:
            assert probe["fits"] is True and probe["batch"] <= memory["max_batch"]
        assert "loss" in memory  # the step at the timed batch ran


def test_plans_are_recorded_and_a_float16_plan_gets_loss_scaling(smoke):
    results = smoke[1]
    float16_plans = 0
    for model in _MODELS:
        row = _record(results, model)
        for plan in _PLANS:
            info = row["plans"].get(plan)
            if info is None or "composition" not in info:
                assert "error" in row["candidates"][plan]
                continue
            assert info["plan"]["format"] == "autoprec.plan"
            assert sum(info["composition"].values()) > 0
            assert "measured" in info  # None where the plan timed nothing
            if info["composition"].get("float16") and "error" not in row["candidates"][plan]:
                float16_plans += 1
                assert row["candidates"][plan]["optimizer"] == "LossScaleOptimizer"
                if "error" not in row["memory"][plan]:
                    assert row["memory"][plan]["optimizer"] == "LossScaleOptimizer"
    # The smoke run predicts for an RTX 2060, where float16 pays on its decoder and CNN.
    assert float16_plans >= 1


def test_attention_overflow_breaks_float16_and_not_the_one_liner(smoke):
    overflow = smoke[1]["attention_overflow"]
    assert "error" not in overflow, overflow.get("traceback")
    assert overflow["logits_amax"] > 65504
    candidates = overflow["candidates"]
    assert candidates["float32"]["finite"] is True
    assert candidates["mixed_float16"]["finite"] is False
    assert candidates["one-liner"]["finite"] is True
    assert math.isfinite(candidates["one-liner"]["final_loss"])
    assert overflow["passed"] is True


class _Probe:
    """The bench's probe interface over a device of `limit` samples (no Keras involved)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.sizes = limit, []

    def run(self, size: int) -> float:
        self.sizes.append(size)
        if size > self.limit:
            raise RuntimeError(f"RESOURCE_EXHAUSTED: Out of memory allocating {size} samples")
        return 1.0


def test_largest_batch_doubles_then_bisects_to_the_limit(memory):
    probe = _Probe(limit=300)
    found = memory.largest_batch(probe, 16, 16 * 64, None, 8, end=float("inf"))
    assert found["max_batch_bound"] == "oom"
    assert found["max_batch"] <= 300 < found["first_oom_batch"]
    assert found["first_oom_batch"] - found["max_batch"] <= 2
    assert probe.sizes[:5] == [32, 64, 128, 256, 512]  # doubling, then bisection
    assert [entry["batch"] for entry in found["probes"]] == probe.sizes


def test_largest_batch_starts_from_its_guess_and_stops_at_the_cap_or_the_clock(memory):
    probe = _Probe(limit=10**6)
    found = memory.largest_batch(probe, 8, 8 * 4, 1000, 3, end=float("inf"))
    assert (found["max_batch"], found["max_batch_bound"], probe.sizes) == (32, "cap", [32])
    guessed = _Probe(limit=700)
    found = memory.largest_batch(guessed, 8, 8 * 512, 600, 0, end=float("inf"))
    assert guessed.sizes[0] == 512  # 8 x 2^6, the power of two below the guess
    assert (found["max_batch"], found["first_oom_batch"]) == (512, 1024)
    late = _Probe(limit=10**6)
    found = memory.largest_batch(late, 8, 8 * 64, None, 3, end=0.0)
    assert (found["max_batch"], found["max_batch_bound"], late.sizes) == (8, "time", [])


def test_an_error_other_than_out_of_memory_is_raised(memory):
    class Broken:
        def run(self, size: int) -> float:
            raise ValueError("shapes do not match")

    with pytest.raises(ValueError, match="shapes"):
        memory.largest_batch(Broken(), 8, 64, None, 2, end=float("inf"))


def test_compare_picks_the_best_uniform_policy_per_statistic(bench):
    candidates = {
        "float32": {"ms_min": 10.0, "ms_median": 12.0},
        "mixed_bfloat16": {"ms_min": 8.0, "ms_median": 13.0},
        "mixed_float16": {"error": "RuntimeError: no kernel"},
        "one-liner": {"ms_min": 4.0, "ms_median": 6.0},
        "search": {"error": "no plan"},
    }
    found = bench.compare(candidates)
    assert found["best_uniform"] == {"min": "mixed_bfloat16", "median": "float32"}
    assert found["ratios"]["one-liner"] == {"min": 0.5, "median": 0.5}
    assert found["ratios"]["search"] is None


@pytest.mark.parametrize("model", ["transformer", "gpt"])
def test_float8_rows_are_timed_with_the_compiled_hlo_read(smoke, model):
    row = _record(smoke[1], model)
    assert "ms_min" in row["candidates"]["float8"], row["candidates"]["float8"]
    assert row["plans"]["float8"]["composition"].get("float8", 0) > 0, row["plans"]["float8"]
    hlo = row["float8_hlo"]
    assert hlo["device"] and hlo["fp8_gemm_calls"] >= 0
    if "cpu" in hlo["device"].lower():
        assert hlo["fp8_gemm_calls"] == 0  # emulated: no FP8 matrix product on a CPU
