"""Runs a script of bench/ in a subprocess, as a user would, for the bench tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_bench(script: str, *arguments: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Returns the finished run of `bench/<script>` with `arguments` (stdout and stderr captured).

    Args:
        script: the file name in `bench/`, e.g. `"oneliner.py"`.
        *arguments: its command-line arguments.
        timeout: seconds before the run is stopped.

    Returns:
        The `subprocess.CompletedProcess`, with text output.

    Example:

    ```python
    run_bench("oneliner_first_epoch.py", "--models", "mlp", "--steps", "3").returncode  # 0
    ```
    """
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *arguments],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
