"""`autoprec.cli.main`: the command's exit codes, one-line errors, `--debug` and fast start."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from cli.cli_files import FRAMEWORK_NOISE, run_cli, write_model_and_data

import autoprec
from autoprec.cli import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, main


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory):
    return write_model_and_data(tmp_path_factory.mktemp("cli_app"))


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == EXIT_BAD_INPUT
    assert "usage: autoprec" in capsys.readouterr().out


def test_debug_shows_traceback(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text("{broken")
    assert main(["--debug", "show", str(path)]) == EXIT_BAD_INPUT
    assert "Traceback" in capsys.readouterr().err


def _data_module(folder, body: str) -> None:
    (folder / "cli_app_data.py").write_text(textwrap.dedent(body))


def test_a_failure_exits_1_with_one_line_and_debug_adds_the_traceback(
    model_and_data, tmp_path, monkeypatch, capsys
):
    _data_module(tmp_path, "def load():\n    raise RuntimeError('the data server is down')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "cli_app_data", raising=False)
    arguments = ["profile", str(model_and_data[0]), "--data", "cli_app_data:load"]
    assert main(arguments) == EXIT_INTERNAL
    error = capsys.readouterr().err.strip()
    assert error == (
        "autoprec: error: profile failed: RuntimeError: the data server is down "
        "(run with --debug for the traceback)"
    )
    assert main(["--debug", *arguments]) == EXIT_INTERNAL
    error = capsys.readouterr().err
    assert "Traceback" in error and "RuntimeError: the data server is down" in error


def test_an_interrupt_exits_130_naming_the_command(model_and_data, tmp_path, monkeypatch, capsys):
    _data_module(tmp_path, "def load():\n    raise KeyboardInterrupt\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "cli_app_data", raising=False)
    arguments = ["profile", str(model_and_data[0]), "--data", "cli_app_data:load"]
    assert main(arguments) == EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err.strip() == "autoprec: profile interrupted"


def test_module_entry_points_run():
    for module in ("autoprec", "autoprec.cli"):
        result = subprocess.run(
            [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        assert "usage: autoprec" in result.stdout


_IMPORTS_CHECK = """
import sys
import autoprec
heavy = ("tensorflow", "keras", "optuna")
after_import = [name for name in heavy if name in sys.modules]
import autoprec.cli
for argv in (["--help"], ["search", "--help"], ["export", "--help"]):
    try:
        autoprec.cli.main(argv)
    except SystemExit:
        pass
after_help = [name for name in heavy if name in sys.modules]
print("RESULT", after_import, after_help)
"""


def test_import_and_help_load_no_framework():
    result = subprocess.run(
        [sys.executable, "-c", _IMPORTS_CHECK], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "RESULT [] []" in result.stdout, result.stdout[-500:]


def test_help_and_version_answer_fast():
    started = time.perf_counter()
    result = run_cli("--help")
    elapsed = time.perf_counter() - started
    assert result.returncode == 0 and "usage: autoprec" in result.stdout
    assert elapsed < 3.0, f"autoprec --help took {elapsed:.1f} s (a framework import costs ~5 s)"
    version = run_cli("--version")

    assert version.returncode == 0
    assert version.stdout.strip() == f"autoprec {autoprec.__version__}"


def test_missing_file_is_one_line_on_stderr(tmp_path):
    missing = tmp_path / "missing.json"
    result = run_cli("show", str(missing))
    assert result.returncode == EXIT_BAD_INPUT
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("autoprec: error: ") and str(missing) in lines[0]
    assert not any(word in result.stderr.lower() for word in FRAMEWORK_NOISE)
