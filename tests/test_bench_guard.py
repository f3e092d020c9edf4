"""The guard's benchmarks (bench/guard_overhead.py, bench/faults.py) run in their smallest mode."""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
SCRIPTS = ("guard_overhead.py", "faults.py")


@pytest.fixture(scope="module")
def smoke_reports() -> dict[str, dict]:
    """Runs both benchmarks with `--smoke` side by side; their last printed line, parsed."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    processes = {
        name: subprocess.Popen(
            [sys.executable, str(BENCH / name), "--smoke"],
            cwd=ROOT,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in SCRIPTS
    }
    reports = {}
    for name, process in processes.items():
        stdout, stderr = process.communicate(timeout=240)
        assert process.returncode == 0, stderr[-3000:]
        lines = [line for line in stdout.splitlines() if line.strip()]
        assert any(line.startswith("host: ") for line in lines), stdout
        reports[name] = json.loads(lines[-1])
    return reports


def test_guard_overhead_prints_finite_positive_ratios_and_the_host(smoke_reports):
    report = smoke_reports["guard_overhead.py"]
    assert report["host"] and report["rounds"] >= 5
    assert set(report["models"]) == {"resnet-cnn", "transformer"}
    for name, row in report["models"].items():
        for key in (
            "off_ms_min",
            "off_ms_median",
            "skip_ms_min",
            "on_ms_min",
            "on_ms_median",
            "ratio_min",
            "ratio_median",
            "telemetry_ratio_min",
            "telemetry_ratio_median",
        ):
            assert math.isfinite(row[key]) and row[key] > 0, (name, key, row[key])
        assert row["off_ms_min"] <= row["off_ms_median"] and row["on_ms_min"] <= row["on_ms_median"]
        assert row["weights_finite"]


def test_every_guard_fault_kind_reports_recovered(smoke_reports):
    report = smoke_reports["faults.py"]
    assert report["host"]
    faults = {row["fault"]: row for row in report["faults"]}
    assert len(faults) == 3
    for row in faults.values():
        assert row["recovered"] and row["weights_finite"], row
        assert math.isfinite(row["final_loss"]) and math.isfinite(row["float32_loss"]), row
        assert 0 <= row["lost_from_onset"] <= row["lost"] <= row["steps"], row
    drift = next(row for name, row in faults.items() if name.startswith("data drift"))
    assert any(entry.startswith("middle ") for entry in drift["promoted"]), drift
    nan = next(row for name, row in faults.items() if name.startswith("NaN batch"))
    assert nan["raised"] is True and not nan["promoted"], nan


def _autoprec_imports(path: Path) -> list[str]:
    """`autoprec...` names a script imports, as dotted paths (`from a import b` gives `a.b`)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return [name for name in names if name.split(".")[0] == "autoprec"]


@pytest.mark.parametrize("script", [*SCRIPTS, "faults_guard.py", "profiler_overhead.py"])
def test_guard_benchmarks_use_public_names_only(script):
    private = [
        name
        for name in _autoprec_imports(BENCH / script)
        if any(part.startswith("_") for part in name.split("."))
    ]
    assert not private, f"bench/{script} imports private names: {private}"
