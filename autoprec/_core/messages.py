"""The one way autoprec shows a message to the user: stdout as Keras prints, or the `autoprec`
logger."""

from __future__ import annotations

import logging
import sys

import keras

logger = logging.getLogger("autoprec")


def show_message(message: str, verbose: int = 1, level: int = logging.INFO) -> None:
    """Shows one line of progress or a warning, where Keras shows its own."""
    interactive = keras.config.is_interactive_logging_enabled()
    if verbose and interactive:
        sys.stdout.write(message + "\n")
        sys.stdout.flush()
    if level >= logging.WARNING or (verbose and not interactive):
        logger.log(level, message)
