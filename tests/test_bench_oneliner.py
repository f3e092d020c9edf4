"""bench/oneliner.py (the one-liner and the search against Keras' uniform policies) on its tiny model."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import run_bench

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "oneliner.py"
CANDIDATES = {"float32", "mixed_bfloat16", "one-liner", "search"}


def _run(*arguments: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return run_bench(SCRIPT.name, *arguments, timeout=timeout)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[str, dict]:
    """The bench on its tiny model, 2 rounds, 2 search trials: its stdout and its JSON figures."""
    path = tmp_path_factory.mktemp("oneliner") / "figures.json"
    result = _run(
        "--models",
        "tiny",
        "--rounds",
        "2",
        "--trials",
        "2",
        "--trial-steps",
        "4",
        "--json",
        str(path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, json.loads(path.read_text())


def test_prints_the_host_each_candidate_and_a_verdict_per_plan(tiny_run):
    stdout, report = tiny_run
    lines = stdout.splitlines()
    assert lines[0].startswith("host: ") and "16-bit flags:" in lines[0], lines[0]
    assert report["host"]["cpu"] and isinstance(report["host"]["flags"], list)
    for candidate in CANDIDATES:
        assert any(line.split()[:1] == [candidate] for line in lines), (candidate, stdout)
    assert "one-liner added" in stdout and "to the first epoch" in stdout
    verdicts = [line.split()[0] for line in lines if line.strip().endswith("median)")]
    assert len(verdicts) == 2 and set(verdicts) <= {"PASS", "FAIL"}, stdout
    assert "== summary" in stdout and "geomean" in stdout
    assert "fewer than 5 rounds" in stdout  # 2 rounds are flagged as not conclusive


def test_figures_have_every_candidate_ratio_plan_and_summary(tiny_run):
    _, report = tiny_run
    assert report["settings"]["rounds"] == 2 and report["settings"]["search"] is True
    row = report["models"]["tiny"]
    assert row["errors"] == {}, row["errors"]
    expected = CANDIDATES | ({"mixed_float16"} if report["settings"]["float16"] else set())
    assert set(row["candidates"]) == expected
    for name, figures in row["candidates"].items():
        assert len(figures["rounds_ms"]) == 2, name
        assert 0 < figures["ms_min"] <= figures["ms_median"], (name, figures)
        assert figures["ms_min"] == min(figures["rounds_ms"]), name
    assert set(row["best_uniform"].values()) <= {"float32", "mixed_bfloat16", "mixed_float16"}
    for plan in ("one-liner", "search"):
        ratio = row["ratios"][plan]
        best = row["candidates"][row["best_uniform"]["min"]]["ms_min"]
        assert math.isclose(ratio["min"], row["candidates"][plan]["ms_min"] / best), plan
        assert row["verdicts"][plan] == ("PASS" if ratio["min"] <= 1.03 else "FAIL")
        composition = row["plans"][plan]["composition"]
        assert sum(composition.values()) == 3 and set(composition) <= {
            "float32",
            "bfloat16",
            "float16",
        }, composition
        assert isinstance(row["plans"][plan]["report"], dict)
    assert row["plans"]["one-liner"]["report"], "the one-liner recorded no figures in its plan"
    added = row["fit_autoprecision_s"] - row["fit_plain_s"]
    assert math.isclose(row["one_liner_added_s"], added)
    assert row["search_s"] > 0 and isinstance(row["sixteen_bit_pays"], bool)
    summary = report["summary"]
    ratios = row["ratios"]["one-liner"]
    assert math.isclose(summary["geomean"]["one-liner"]["min"], ratios["min"])
    assert set(summary["goal"]) == {"one-liner", "search"}
    for goal in summary["goal"].values():
        assert goal["pass"] == (goal["models_pass"] and goal["geomean_below_1"] is not False)


@pytest.fixture(scope="module")
def bench_module():
    """bench/oneliner.py imported in this process."""
    spec = importlib.util.spec_from_file_location("bench_oneliner", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_an_unknown_model_name_is_refused_with_the_choices(bench_module):
    with pytest.raises(SystemExit, match="nosuchmodel.*densenet121"):
        bench_module.main(["--models", "resnet,nosuchmodel", "--no-search"])


def test_the_default_list_has_eight_kinds_of_model_and_quick_two(bench_module):
    assert len(bench_module.MODELS) >= 8 and "tiny" not in bench_module.MODELS
    assert set(bench_module.QUICK_MODELS) < set(bench_module.MODELS)
    assert len(bench_module.QUICK_MODELS) == 2


def test_keras_global_policy_comes_back_after_a_build_under_another(bench_module):
    import keras

    before = keras.config.dtype_policy().name
    model = bench_module.build_copy(bench_module.EXTRA_MODELS["tiny"], None, "mixed_bfloat16")
    assert keras.config.dtype_policy().name == before
    assert {layer.dtype_policy.name for layer in model.layers[1:]} == {"mixed_bfloat16"}
    assert model.optimizer is not None and model.compiled


def _autoprec_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return [name for name in names if name.split(".")[0] == "autoprec"]


@pytest.mark.parametrize("part", ["oneliner.py", "oneliner_report.py"])
def test_the_bench_uses_public_names_only(part):
    path = SCRIPT.parent / part
    text = path.read_text()
    private = [
        name
        for name in _autoprec_imports(path)
        if any(part.startswith("_") for part in name.split("."))
    ]
    assert not private, private
    used = {
        node.attr
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "autoprec"
    }
    assert not [name for name in used if name.startswith("_") and name != "__version__"], used
