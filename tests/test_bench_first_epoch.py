"""bench/oneliner_first_epoch.py (epoch wall times with and without the one-liner) on its MLP."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from bench_scripts import run_bench

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "oneliner_first_epoch.py"


def _run(*arguments: str) -> subprocess.CompletedProcess:
    return run_bench(SCRIPT.name, *arguments, timeout=240)


@pytest.fixture(scope="module")
def mlp_run() -> str:
    """The bench on its MLP, 2 rounds of 2 epochs of 3 steps, bfloat16 told fast: its stdout."""
    result = _run(
        "--models", "mlp", "--epochs", "2", "--rounds", "2", "--steps", "3", "--fast-bfloat16"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_each_round_prints_both_fits_epochs_and_the_plan_kept(mlp_run):
    rounds = re.findall(
        r"^  mlp round (\d), seconds per epoch: plain ([\d. ]+) \| one-liner ([\d. ]+); "
        r"kept (\d+ \w+)",
        mlp_run,
        flags=re.MULTILINE,
    )
    assert [number for number, *_ in rounds] == ["1", "2"], mlp_run
    for _, plain, one_liner, kept in rounds:
        assert len(plain.split()) == 2 and len(one_liner.split()) == 2
        assert all(float(seconds) > 0 for seconds in (plain + " " + one_liner).split())
        assert kept.endswith(("float32", "bfloat16"))


def test_the_table_has_ratios_later_epochs_and_the_decision(mlp_run):
    header, _, row = [line for line in mlp_run.splitlines() if line.startswith("|")][:3]
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    cells = dict(zip(columns, (cell.strip() for cell in row.strip("|").split("|"))))
    assert cells["model"] == "mlp"
    assert re.fullmatch(r"\d+\.\d\dx", cells["first epoch ratio"])
    assert re.fullmatch(r"\d+\.\d\dx", cells["fit ratio"])
    plain, one_liner = cells["later epochs s, plain / one-liner (median)"].split(" / ")
    assert float(plain) > 0 and float(one_liner) > 0
    assert float(cells["deciding s"]) >= 0
    assert mlp_run.startswith("host: ")


def test_an_unknown_model_is_refused():
    result = _run("--models", "no_such_model", "--epochs", "1", "--steps", "1")
    assert result.returncode != 0
    assert "--models: unknown model(s) no_such_model; choose from mobilenetv2" in result.stderr


def test_the_rerun_in_a_fresh_process_recalls_what_the_first_fit_kept():
    result = _run("--models", "mlp", "--epochs", "2", "--steps", "14", "--rerun", "--fast-bfloat16")
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(row for row in result.stdout.splitlines() if row.startswith("  mlp round 1"))
    assert re.search(r"plain [\d. ]+\| first [\d. ]+\| rerun [\d. ]+;", line), line
    kept = re.search(r"kept (.+), rerun (.+), recalled \{'(step_ms|afresh)'", line)
    assert kept, line
    # The stored plan ran from the first step: it was kept after its step-time check or, on a host
    # busier than in the first fit, that check (made only on a recalled plan) drifted and the
    # rerun decided afresh.
    drifted = r"\{'afresh': 'its step took [\d.]+ ms against [\d.]+ ms stored, beyond [\d.]+ ms'\}"
    if kept.group(3) == "step_ms":
        assert kept.group(1) == kept.group(2), line
    else:
        assert re.search(drifted, line), line
    assert "| first fit / plain | rerun first epoch / plain |" in result.stdout
