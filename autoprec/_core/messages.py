"""The one way autoprec shows a message to the user: stdout as Keras prints, or the `autoprec` logger."""

from __future__ import annotations

import logging
import sys

import keras

logger = logging.getLogger("autoprec")


def show_message(message: str, verbose: int = 1, level: int = logging.INFO) -> None:
    """Shows one line of progress or a warning, where Keras shows its own.

    While Keras' interactive logging is on (`keras.config.is_interactive_logging_enabled()`,
    the default) the line goes to stdout at `verbose >= 1`; once it is off
    (`keras.config.disable_interactive_logging()`) it goes to the `"autoprec"`
    logger instead. Warnings always go to the logger too, whatever `verbose`.

    Args:
        message: the line to show.
        verbose: 0 shows nothing (warnings are still logged), 1 or more shows it.
        level: the logging level, `logging.INFO` or `logging.WARNING`.

    Example:

    ```python
    from autoprec._core.messages import show_message

    show_message("autoprec: plan applied", verbose=1)
    ```
    """
    interactive = keras.config.is_interactive_logging_enabled()
    if verbose and interactive:
        sys.stdout.write(message + "\n")
        sys.stdout.flush()
    if level >= logging.WARNING or (verbose and not interactive):
        logger.log(level, message)
