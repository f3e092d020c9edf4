"""`bench/gpu.py --smoke`: the prepared GPU benchmark still runs, on a CPU with JAX and no TensorFlow."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu.py"
_MODELS = ("resnet50", "transformer", "mobilenetv2", "attention_overflow")
_POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "autoprec")

# As on the GPU machine: TensorFlow cannot be imported.
_LAUNCH = (
    "import runpy, sys; sys.modules['tensorflow'] = None; "
    "sys.argv = [sys.argv[1], *sys.argv[2:]]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    """Runs the smoke benchmark once and returns its results JSON."""
    pytest.importorskip("jax", reason="jax is not installed: pip install 'jax[cpu]'")
    out_dir = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run(
        [sys.executable, "-c", _LAUNCH, str(_SCRIPT), "--smoke", "--out", str(out_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert (
        "speedup" in completed.stdout.splitlines()[-1] or "attention_overflow" in completed.stdout
    )
    return json.loads((out_dir / "results.json").read_text())


def test_smoke_run_needs_no_tensorflow(smoke_results):
    environment = smoke_results["environment"]
    assert environment["keras_backend"] == "jax"
    assert environment["tensorflow_imported"] is False
    assert environment["tensorflow_imported_at_end"] is False


@pytest.mark.parametrize("model", _MODELS)
def test_every_policy_has_a_positive_step_time(smoke_results, model):
    policies = smoke_results["models"][model]["policies"]
    for policy in _POLICIES:
        result = policies[policy]
        assert "error" not in result, f"{model}/{policy}: {result.get('traceback', result)}"
        assert result["step_seconds"] > 0
        assert all(seconds > 0 for seconds in result["repeat_seconds"])


def test_autoprec_plan_is_calibrated_and_recorded(smoke_results):
    result = smoke_results["models"]["resnet50"]["policies"]["autoprec"]
    assert result["evidence"]["distinct_layers_timed"] > 0
    assert sum(result["plan_dtype_counts"].values()) > 0
    assert result["plan"]["format"] == "autoprec.plan"


def test_attention_overflow_breaks_float16_and_not_the_plan(smoke_results):
    policies = smoke_results["models"]["attention_overflow"]["policies"]
    assert policies["mixed_float16"]["finite"] is False
    assert policies["autoprec"]["finite"] is True
    assert math.isfinite(policies["autoprec"]["final_loss"])
    assert policies["autoprec"]["optimizer"] in ("FlooredLossScaleOptimizer", "Adam", "SGD")
    logits = smoke_results["models"]["attention_overflow"]["policies"]["autoprec"]["evidence"][
        "attention_logits_amax"
    ]
    assert max(logits.values()) > 65504
