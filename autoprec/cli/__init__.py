"""The `autoprec` command: a thin layer over the library.

`autoprec --help` imports neither Keras nor TensorFlow: each command imports the
stages it needs inside its handler. Exit codes: 0 success, 2 usage error (one
line naming the file, field or flag; add `--debug` for a traceback), 1 failure.
"""

from .app import main
from .parser import build_parser

__all__ = ["build_parser", "main"]
