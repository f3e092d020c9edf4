"""bench/fp8.py (float8 plans predicted on three cards, budgets checked here) in its smallest mode."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "fp8.py"
CARDS = ("rtx4090", "rtx5090", "h100")
UNIFORM = ("float32", "bfloat16", "float8 wherever")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[str, dict]:
    """The bench's quick mode on its tiny MLP: its stdout and its JSON figures."""
    path = tmp_path_factory.mktemp("fp8") / "figures.json"
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--models", "mlp", "--json", str(path)],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, json.loads(path.read_text())


@pytest.fixture(scope="module")
def bench_module():
    """bench/fp8.py imported in this process."""
    spec = importlib.util.spec_from_file_location("bench_fp8", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_prints_the_host_a_row_per_plan_and_the_goals(quick_run):
    stdout, report = quick_run
    lines = stdout.splitlines()
    assert lines[0].startswith("host: ") and "CPU cores" in lines[0], lines[0]
    assert report["host"]["cpu"] and report["host"]["cores"]
    for plan in (*UNIFORM, *(f"heuristic {card}" for card in CARDS), "search rtx4090"):
        assert any(line.strip().startswith(plan + " ") for line in lines), (plan, stdout)
    assert "CPU step here (float8 emulated)" in stdout
    verdicts = [line.split()[0] for line in lines if "best uniform plan holding" in line]
    assert verdicts and set(verdicts) <= {"PASS", "FAIL"}, stdout
    assert "== goals" in stdout


def test_figures_hold_predictions_speedups_budgets_and_checks(quick_run):
    _, report = quick_run
    row = report["models"]["mlp"]
    assert row["errors"] == {}, row["errors"]
    plans = row["plans"]
    assert {*UNIFORM, "search rtx4090"} <= set(plans)
    bfloat16 = plans["bfloat16"]["predicted_ms"]
    for name, figures in plans.items():
        assert set(figures["predicted_ms"]) == set(CARDS), name
        for card, ms in figures["predicted_ms"].items():
            assert ms > 0, (name, card)
            assert math.isclose(figures["speedup_vs_bfloat16"][card], bfloat16[card] / ms)
        assert figures["val_loss"] is not None and math.isfinite(figures["val_loss"]), name
        assert figures["holds"] == (figures["val_loss"] <= row["budget_limit"]), name
        # judged at the search's steps and at the end of the longer retraining
        assert set(figures["val_loss_at"]) == {"3", "4"}, name
        assert figures["val_loss"] == figures["val_loss_at"]["4"], name
        assert figures["holds_at"]["4"] == figures["holds"], name
    # float8 wherever Keras allows it: every Dense, the head included
    assert plans["float8 wherever"]["composition"] == {"float8": 4}
    assert plans["float32"]["composition"] == {"float32": 4}
    limit = row["budget_limit"]
    assert math.isclose(limit, plans["float32"]["val_loss"] * 1.02)
    for check in row["not_slower_checks"]:
        best = check["best_uniform"]
        assert best in UNIFORM and plans[best]["holds"], check
        ratio = (
            plans[check["plan"]]["predicted_ms"][check["card"]]
            / plans[best]["predicted_ms"][check["card"]]
        )
        assert math.isclose(check["ratio"], ratio) and check["pass"] == (ratio <= 1.0 + 1e-9)
    timing = row["cpu_step_ms"]
    for name in ("float32", "float8 wherever"):
        assert 0 < timing[name]["min"] <= timing[name]["median"], timing
        assert len(timing[name]["rounds"]) == report["settings"]["rounds"]
    goals = report["goals"]
    assert goals["not_slower"]["pass"] == all(
        check["pass"] for check in goals["not_slower"]["checks"]
    )


def test_default_sizes_are_the_realistic_fp8_shapes(bench_module):
    specs = bench_module.model_specs(quick=False)
    assert set(specs) == set(bench_module.MODEL_NAMES)
    for name in ("gpt", "encoder"):
        predicted, trained = specs[name].predicted, specs[name].trained
        assert predicted.batch * predicted.length >= 4096, name
        assert trained.length < predicted.length, name
        assert "1024 wide" in specs[name].kind, specs[name].kind
    assert specs["mlp"].predicted.batch >= 4096


def test_the_tiny_decoder_is_causal_and_takes_any_length(bench_module):
    model = bench_module.model_specs(quick=True)["gpt"].build()
    tokens = np.random.default_rng(0).integers(0, 64, (1, 12)).astype("int32")
    changed = tokens.copy()
    changed[0, 8:] = (changed[0, 8:] + 1) % 64
    before, after = model(tokens), model(changed)
    assert np.allclose(before[0, :8], after[0, :8], atol=1e-5)
    assert not np.allclose(before[0, 8:], after[0, 8:], atol=1e-5)
    assert model(tokens[:, :5]).shape == (1, 5, 256)


def test_unknown_models_or_cards_are_refused(bench_module):
    with pytest.raises(SystemExit, match="nosuchmodel"):
        bench_module.main(["--models", "gpt,nosuchmodel"])
    with pytest.raises(SystemExit, match="rtx3090"):
        bench_module.main(["--search-hardware", "rtx3090"])


@pytest.mark.parametrize("part", ["fp8.py", "fp8_models.py", "fp8_report.py"])
def test_the_bench_uses_public_names_only(part):
    private = []
    for node in ast.walk(ast.parse((SCRIPT.parent / part).read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autoprec"):
            names = [node.module, *(alias.name for alias in node.names)]
            private += [name for name in names if any(p.startswith("_") for p in name.split("."))]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "autoprec"
            and node.attr.startswith("_")
            and node.attr != "__version__"
        ):
            private.append(node.attr)
    assert not private, private
