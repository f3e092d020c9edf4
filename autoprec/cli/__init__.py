"""The `autoprec` command: a thin layer over the library."""

from .app import main
from .parser import build_parser

__all__ = ["build_parser", "main"]
