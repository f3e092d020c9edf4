"""`autoprec._core.models.show_message`: stdout while Keras prints, the `autoprec` logger after."""

from __future__ import annotations

import logging
import subprocess
import sys

import keras
import pytest

from autoprec._core.models import logger, show_message


@pytest.fixture
def interactive_logging():
    """Restores Keras' interactive logging after a test that turns it off."""
    was_on = keras.config.is_interactive_logging_enabled()
    yield
    if was_on:
        keras.config.enable_interactive_logging()
    else:
        keras.config.disable_interactive_logging()


_IMPORT_CHECK = """
import logging
root = list(logging.getLogger().handlers), logging.getLogger().level
from autoprec._core.models import show_message
show_message("shown", verbose=1)
print("RESULT", root == (logging.getLogger().handlers, logging.getLogger().level),
      logging.getLogger("autoprec").handlers)
"""


def test_the_logger_is_autoprec_and_the_root_logger_is_left_alone():
    assert logger is logging.getLogger("autoprec")
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHECK], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-2:] == ["shown", "RESULT True []"], result.stdout


def test_info_goes_to_stdout_while_keras_prints(interactive_logging, capsys, caplog):
    keras.config.enable_interactive_logging()
    with caplog.at_level(logging.INFO, logger="autoprec"):
        show_message("autoprec: plan applied")
        show_message("not shown", verbose=0)
    assert capsys.readouterr().out == "autoprec: plan applied\n"
    assert caplog.records == []


def test_info_goes_to_the_logger_once_keras_logs(interactive_logging, capsys, caplog):
    keras.config.disable_interactive_logging()
    with caplog.at_level(logging.INFO, logger="autoprec"):
        show_message("autoprec: plan applied", verbose=1)
        show_message("not shown", verbose=0)
    assert capsys.readouterr().out == ""
    assert [(record.name, record.levelno, record.getMessage()) for record in caplog.records] == [
        ("autoprec", logging.INFO, "autoprec: plan applied")
    ]


@pytest.mark.parametrize("interactive", [True, False])
@pytest.mark.parametrize("verbose", [0, 1])
def test_warnings_always_reach_the_logger(
    interactive_logging, capsys, caplog, interactive, verbose
):
    if interactive:
        keras.config.enable_interactive_logging()
    else:
        keras.config.disable_interactive_logging()
    with caplog.at_level(logging.INFO, logger="autoprec"):
        show_message("autoprec: layer promoted", verbose=verbose, level=logging.WARNING)
    assert [record.getMessage() for record in caplog.records] == ["autoprec: layer promoted"]
    printed = capsys.readouterr().out
    assert printed == ("autoprec: layer promoted\n" if verbose and interactive else "")
