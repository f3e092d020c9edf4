"""The one way autoprec shows a message to the user: stdout as Keras prints, or the `autoprec` logger."""

from __future__ import annotations

import logging
import sys

import keras

logger = logging.getLogger("autoprec")


def show_message(message: str) -> None:
    """Shows a user-facing message the way Keras shows its own.

    With Keras' interactive logging on (the default) the message is written to
    stdout, as Keras' own `print_msg` writes its progress; after
    `keras.config.disable_interactive_logging()` it goes to the `autoprec` logger at
    INFO level instead, so a service that routes its logs sees it there. Nothing
    global is configured.

    Args:
        message: the text, one or more lines.

    Example:

    ```python
    from autoprec._core.messages import show_message

    show_message("autoprec: plan applied")
    ```
    """
    if keras.config.is_interactive_logging_enabled():
        sys.stdout.write(message + "\n")
        sys.stdout.flush()
    else:
        logger.info(message)
