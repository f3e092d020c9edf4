"""The search benchmark (bench/search.py) runs its quick path on its smallest model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "search.py"
RATIO_COLUMNS = [
    "model",
    "hardware",
    "trials",
    "search wall s",
    "train steps",
    "plan (bf16/f32/f16)",
    "plan / best uniform within budget",
    "uniform 16-bit held",
    "16-bit speed recovered",
    "search confirmation",
    "bench retrain",
]


def _table(lines: list[str], first_column: str, second_column: str) -> list[list[str]]:
    """The rows of the markdown table whose header starts with the two columns (header first)."""
    header = f"| {first_column} | {second_column} |"
    start = next(index for index, line in enumerate(lines) if line.startswith(header[:-2]))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return [rows[0], *rows[2:]]


@pytest.mark.slow
def test_quick_run_of_the_gru_prints_host_tables_and_goals():
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--models", "gru", "--hardware", "local"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = [line for line in completed.stdout.splitlines() if line.strip()]
    assert lines[0].startswith("host: ") and "cores" in lines[0], lines[0]

    ratio = _table(lines, "model", "hardware")
    assert ratio[0] == RATIO_COLUMNS
    assert len(ratio) == 2 and ratio[1][:2] == ["gru", "local"], ratio
    cells = dict(zip(RATIO_COLUMNS, ratio[1]))
    assert not cells["hardware"].startswith("error"), ratio[1]
    assert float(cells["search wall s"]) > 0
    assert sum(int(count) for count in cells["plan (bf16/f32/f16)"].split("/")) > 0
    value = cells["plan / best uniform within budget"].split()[0]
    assert value == "n/a" or 0.0 < float(value) < 5.0, cells

    timing = _table(lines, "model", "val_loss plan / ref (≤)")
    assert timing[0][:5] == [
        "model",
        "val_loss plan / ref (≤)",
        "plan ms",
        "float32 ms",
        "uniform bfloat16 ms",
    ]
    median, fastest = (float(part) for part in timing[1][3].split(" / "))
    assert 0.0 < fastest <= median, timing[1]
    assert any(line.startswith("goal ResNet50 search") for line in lines)
