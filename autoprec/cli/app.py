"""`main`: parses the command line, runs the command, turns errors into one line and an exit code."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable, Sequence

from ..errors import AutoprecError
from .inputs import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED
from .parser import build_parser
from .quiet import autoprec_messages, configure_framework_logging, quiet_framework_imports


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the `autoprec` command and returns its exit code."""
    configure_framework_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        with quiet_framework_imports(), autoprec_messages(getattr(args, "verbose", 1)):
            return handler(args)
    except (AutoprecError, json.JSONDecodeError) as error:
        if args.debug:
            traceback.print_exc()
        print(f"autoprec: error: {_one_line(error)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"autoprec: {args.command} interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:  # a failure: say so, keep the details one flag away
        if args.debug:
            traceback.print_exc()
        print(
            f"autoprec: error: {args.command} failed: {type(error).__name__}: "
            f"{_one_line(error)} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
