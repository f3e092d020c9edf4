"""Atomic file writes and JSON reads with errors that name the file."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write(
    path: str | os.PathLike, write: Callable[[str], object], suffix: str = ".tmp"
) -> Path:
    """Writes `path` atomically: `write(temporary path)` in the same folder, fsync, rename."""
    destination = Path(path)
    destination.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(
        prefix=f".{destination.name}.", suffix=suffix, dir=destination.parent
    )
    os.close(handle)
    try:
        write(temp_name)
        with open(temp_name, "rb") as written:
            os.fsync(written.fileno())
        os.replace(temp_name, destination)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    with contextlib.suppress(OSError):  # the rename made durable where the folder can be synced
        directory_handle = os.open(destination.parent, os.O_RDONLY)
        try:
            os.fsync(directory_handle)
        finally:
            os.close(directory_handle)
    return destination


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Writes `text` to `path` atomically (see `atomic_write`)."""
    return atomic_write(path, lambda name: Path(name).write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | os.PathLike, data: Any) -> Path:
    """Writes `data` as indented JSON to `path` atomically (see `atomic_write_text`)."""
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json_file(path: str | os.PathLike, error_class: type[Exception], what: str) -> Any:
    """Reads a JSON file, raising `error_class` with the file name on any failure."""
    file_path = Path(path)
    try:
        text = file_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error_class(f"{file_path}: no such file; expected a {what} JSON file.") from None
    except (OSError, UnicodeDecodeError) as error:
        raise error_class(f"{file_path}: cannot read {what}: {error}") from None
    return parse_json_text(text, error_class, what, source=str(file_path))


def parse_json_text(text: str, error_class: type[Exception], what: str, source: str) -> Any:
    """Decodes JSON text, raising `error_class` naming `source`, line and column."""
    if not text.strip():
        raise error_class(f"{source}: the {what} is empty (truncated write?); re-create it.")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise error_class(
            f"{source}: not valid JSON at line {error.lineno}, column {error.colno}: "
            f"{error.msg}. The {what} may be truncated or hand-edited; fix it or re-create it."
        ) from None
