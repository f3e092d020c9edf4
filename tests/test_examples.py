"""Every example runs end to end in its smoke mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("name", sorted(path.name for path in EXAMPLES.glob("*.py")))
def test_example_runs_in_smoke_mode(name, tmp_path):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--smoke"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
