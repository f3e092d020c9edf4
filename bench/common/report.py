"""What a benchmark writes: strict JSON (atomically), recorded failures, markdown tables."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import traceback
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by `None` (strict JSON), NumPy scalars as Python's."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return finite(value.item())
    return value


def write_json(path: str | os.PathLike, report: dict[str, Any]) -> None:
    """Writes `report` to `path` atomically (a temporary file in the same folder, then a rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(handle, "w") as file:
            json.dump(finite(report), file, indent=1, default=str, allow_nan=False)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def failure(error: BaseException) -> dict[str, str]:
    """An error as recorded in the results: its line and its traceback's tail.

    Called inside the `except` that caught `error`, so the traceback is the error's.
    """
    return {
        "error": f"{type(error).__name__}: {error}"[:2000],
        "traceback": traceback.format_exc()[-3000:],
    }


def markdown_row(cells: Iterable[Any]) -> str:
    """`| a | b |`."""
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def markdown_table(header: Sequence[str], rows: Iterable[Iterable[Any]]) -> str:
    """A markdown table: the header, its `|---|` rule, a line per row."""
    lines = [markdown_row(header), "|" + "---|" * len(header)]
    lines += [markdown_row(row) for row in rows]
    return "\n".join(lines)
