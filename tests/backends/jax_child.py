"""Runs a check under Keras' JAX backend in a child process and returns what it printed.

Keras fixes its backend at its first import and the test process runs
TensorFlow, so each JAX module's checks run in one child process with
`KERAS_BACKEND=jax` on the CPU; the child prints one line `RESULT <json>`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_jax_child(code: str, xla_flags: str | None = None, timeout: float = 300) -> dict:
    """Runs `code` with `KERAS_BACKEND=jax` from the repository root; returns its `RESULT` JSON."""
    environment = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    if xla_flags is not None:
        environment["XLA_FLAGS"] = xla_flags
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
        env=environment, cwd=ROOT,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = next(x for x in completed.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])
