"""`autoprec.cli`: the command hides the framework's start-up lines and shows autoprec's own."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from cli.cli_files import run_cli, write_model_and_data, write_model_plans

from autoprec.cli import (
    EXIT_OK,
    FRAMEWORK_LOGGERS,
    NATIVE_NOISE,
    autoprec_messages,
    configure_framework_logging,
)


def test_export_in_a_fresh_process_prints_no_framework_lines(tmp_path):
    """Loads TensorFlow and Keras: their start-up lines and load warnings are dropped."""
    model_and_data = write_model_and_data(tmp_path)
    model_plans = write_model_plans(model_and_data[0], tmp_path)
    output = tmp_path / "exported.keras"
    result = run_cli("export", str(model_plans[0]), str(model_and_data[0]), "-o", str(output))
    assert result.returncode == EXIT_OK, result.stderr
    assert result.stderr == "", result.stderr
    assert output.exists() and "written to" in result.stdout


@pytest.mark.parametrize(
    "line",
    [
        "I0000 00:00:1796126097.369 9681 port.cc:153] oneDNN custom operations are on.",
        "W0000 00:00:1796126097.369 9681 cuda_executor.cc:1228] could not find cuda drivers",
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow",
    ],
)
def test_native_start_up_lines_are_noise(line):
    assert NATIVE_NOISE.match(line)


@pytest.mark.parametrize(
    "line", ["autoprec: error: plan.json: no such file", "Traceback (most recent call last):"]
)
def test_other_lines_are_kept(line):
    assert not NATIVE_NOISE.match(line)


_QUIET_IMPORT = """
import sys
from autoprec.cli import quiet_framework_imports
with quiet_framework_imports():
    import tensorflow
    inside = any(type(finder).__name__ == "_QuietFinder" for finder in sys.meta_path)
after = any(type(finder).__name__ == "_QuietFinder" for finder in sys.meta_path)
print("RESULT", inside, after, type(tensorflow.__loader__).__name__ != "_QuietLoader")
"""


def test_a_quiet_framework_import_leaves_no_trace():
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(
        [sys.executable, "-c", _QUIET_IMPORT], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    assert "RESULT True False True" in result.stdout, result.stdout
    assert not [line for line in result.stderr.splitlines() if NATIVE_NOISE.match(line)]


def test_configure_framework_logging_raises_the_framework_loggers_to_error(monkeypatch):
    loggers = [logging.getLogger(name) for name in FRAMEWORK_LOGGERS]
    saved = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.INFO)
        loggers[0].setLevel(logging.CRITICAL)  # a stricter level is kept
        monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
        configure_framework_logging()
        assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"
        assert loggers[0].level == logging.CRITICAL
        assert all(logger.level == logging.ERROR for logger in loggers[1:])
    finally:
        for logger, level in zip(loggers, saved):
            logger.setLevel(level)


@pytest.mark.parametrize(
    ("verbose", "shown"),
    [(0, ["warning"]), (1, ["info", "warning"]), (2, ["debug", "info", "warning"])],
)
def test_autoprec_messages_follow_verbose_and_end_with_the_command(verbose, shown, capsys):
    package_logger = logging.getLogger("autoprec")
    level, handlers = package_logger.level, list(package_logger.handlers)
    with autoprec_messages(verbose):
        package_logger.debug("debug")
        package_logger.info("info")
        package_logger.warning("warning")
    assert capsys.readouterr().err.split() == shown
    assert package_logger.level == level and package_logger.handlers == handlers
