"""The `autoprec` command on real files: success and each bad-input path with its exit code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import build_mlp

from autoprec import PrecisionPlan
from autoprec.cli import EXIT_BAD_INPUT, EXIT_OK, main


@pytest.fixture
def plan_files(tmp_path):
    plan = PrecisionPlan.uniform(build_mlp(), "bfloat16")
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    plan.save(first)
    plan.with_dtype("dense_2", "float32").save(second)
    return first, second


def test_show_prints_the_plan_table(plan_files, capsys):
    assert main(["show", str(plan_files[0])]) == EXIT_OK
    output = capsys.readouterr().out
    assert "dense_1" in output and "bfloat16" in output


def test_diff_lists_changed_layers(plan_files, capsys):
    assert main(["diff", str(plan_files[0]), str(plan_files[1])]) == EXIT_OK
    assert "~ dense_2" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{broken", "not valid JSON at line 1"),
        ('{"format": "something.else"}', "not an autoprec plan or profile"),
        ('{"format_version": 1, "layers": {"dense": "float8"}}', "unknown dtype 'float8'"),
    ],
)
def test_bad_files_exit_2_with_one_line_naming_the_file(tmp_path, capsys, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["show", str(path)]) == EXIT_BAD_INPUT
    error = capsys.readouterr().err.strip()
    assert message in error and str(path) in error
    assert "Traceback" not in error and len(error.splitlines()) == 1


def test_missing_file_exits_2(tmp_path, capsys):
    assert main(["diff", str(tmp_path / "x.json"), str(tmp_path / "y.json")]) == EXIT_BAD_INPUT
    assert "no such file" in capsys.readouterr().err


def test_debug_shows_traceback(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text("{broken")
    assert main(["--debug", "show", str(path)]) == EXIT_BAD_INPUT
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["demo", "profile", "search", "show", "diff", "hardware"])
def test_help_for_every_command(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert f"usage: autoprec {command}" in capsys.readouterr().out


def test_module_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "autoprec.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "usage: autoprec" in result.stdout


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == EXIT_BAD_INPUT
    assert "usage: autoprec" in capsys.readouterr().out


def test_plan_json_from_cli_round_trips(plan_files):
    data = json.loads(plan_files[1].read_text())
    assert data["layers"]["dense_2"]["dtype"] == "float32"
