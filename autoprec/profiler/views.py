"""Views of a profile's numbers: the summary table and the exponent heat map."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import numerics
from .float8_ranges import Float8Ranges

#: Column titles of `summary_table`.
SUMMARY_COLUMNS: tuple[str, ...] = (
    "layer", "class", "max|x|", "f16 ovf", "f16 ftz", "bf16 ftz", "max|g|", "loss scale",
    "g ftz@scale", "f16 safe",
)  # fmt: skip

#: Column titles `summary_table` adds when some layer has float8 ranges.
FLOAT8_COLUMNS: tuple[str, ...] = ("f8 ftz", "f8 sat", "amax x/step", "f8 safe")

#: How the float8 flush-to-zero column names the tensor that flushes most.
FLOAT8_TENSOR_LABELS = {"inputs": "in", "kernel": "kernel", "output_gradients": "grad"}


def _risk_key(layer: Any) -> tuple:
    return (
        layer.float16_safe,
        not layer.float16_exceeds_max,
        -layer.float16_overflow_fraction,
        -layer.gradient_underflow_fraction,
        -layer.float16_underflow_fraction,
        layer.float16_headroom_bits,
    )


def format_fraction(value: float) -> str:
    """Returns a fraction as a short percentage (`"0"`, `"12.50%"`, `"3.0e-06"`)."""
    if value == 0:
        return "0"
    return f"{value:.2%}" if value >= 1e-4 else f"{value:.1e}"


def format_scale(scale: float | None) -> str:
    """Returns a power-of-two scale as `"2^k"`, or `"-"` for `None`."""
    return "-" if scale is None else f"2^{int(round(math.log2(scale)))}"


def _cells(layer: Any) -> tuple[str, ...]:
    forward, gradient = layer.forward, layer.gradient
    return (
        layer.path,
        layer.class_name,
        f"{forward.max_abs:.3g}" if forward is not None else "-",
        format_fraction(layer.float16_overflow_fraction)
        + ("!" if layer.float16_exceeds_max else ""),
        format_fraction(layer.float16_underflow_fraction),
        format_fraction(layer.bfloat16_underflow_fraction),
        f"{gradient.max_abs:.3g}" if gradient is not None else "-",
        format_scale(layer.suggested_loss_scale),
        format_fraction(layer.gradient_underflow_fraction) if gradient is not None else "-",
        "yes" if layer.float16_safe else "NO",
    )


def _float8_cells(ranges: Float8Ranges | None) -> tuple[str, ...]:
    if ranges is None:
        return ("-",) * len(FLOAT8_COLUMNS)
    flush = format_fraction(ranges.flush_fraction)
    tensors = ranges.tensors
    flushing = max(tensors, key=lambda name: tensors[name].flush_fraction, default=None)
    if ranges.flush_fraction and flushing is not None:
        flush += " " + FLOAT8_TENSOR_LABELS.get(flushing, flushing)
    saturation, growth = ranges.saturation_fraction, ranges.amax_growth
    return (
        flush,
        "-" if saturation is None else format_fraction(saturation),
        "-" if growth is None else f"{growth:.3g}",
        "yes" if ranges.safe else "NO",
    )


def summary_table(
    model_name: str,
    steps: int,
    loss_scale: float | None,
    layers: Sequence[Any],
    max_rows: int | None = None,
) -> str:
    """Returns `Profile.summary`'s table: a line per `LayerProfile`, riskiest for float16 first."""
    ordered = sorted(layers, key=_risk_key)
    if max_rows is not None:
        ordered = ordered[:max_rows]
    eligible = [layer.float8 for layer in layers if layer.float8 is not None]
    columns, table = SUMMARY_COLUMNS, [_cells(layer) for layer in ordered]
    title = (
        f"Profile of {model_name or 'model'}: {steps} steps, {len(layers)} layers, "
        f"float16 loss scale {format_scale(loss_scale)}"
    )
    if eligible:
        columns = SUMMARY_COLUMNS + FLOAT8_COLUMNS
        table = [cells + _float8_cells(layer.float8) for cells, layer in zip(table, ordered)]
        unsafe = sum(not ranges.safe for ranges in eligible)
        title += f", float8: {unsafe} of {len(eligible)} Dense/EinsumDense layers unsafe"
    return title + "\n" + text_table(columns, table)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Returns `rows` under `headers` in left-aligned columns, with a rule under the headers."""
    table = [[str(cell) for cell in row] for row in (headers, *rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in table]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def _occupied_exponent_range(matrices: Sequence[np.ndarray]) -> tuple[int, int]:
    occupied = np.flatnonzero(np.sum([matrix.sum(axis=0) for matrix in matrices], axis=0))
    low, high = numerics.FLOAT16.min_subnormal_exponent - 2, numerics.FLOAT16.max_exponent + 2
    if occupied.size:
        low = min(low, int(occupied[0]) + numerics.HISTOGRAM_MIN_EXPONENT - 1)
        high = max(high, int(occupied[-1]) + numerics.HISTOGRAM_MIN_EXPONENT + 1)
    return low, high


def _mark_format_ranges(axis, low: int, high: int) -> None:
    styles = {"float16": ("tab:red", "--"), "bfloat16": ("tab:orange", ":")}
    for name, (colour, style) in styles.items():
        fmt = numerics.float_format(name)
        axis.axvspan(
            max(low - 0.5, fmt.min_normal_exponent - 0.5),
            min(high + 0.5, fmt.max_exponent + 0.5),
            color=colour,
            alpha=0.06,
        )
        for exponent, label in (
            (fmt.min_subnormal_exponent - 0.5, f"{name} flush to zero below"),
            (fmt.max_exponent + 0.5, f"{name} overflow above"),
        ):
            if low - 0.5 <= exponent <= high + 0.5:
                axis.axvline(exponent, color=colour, linestyle=style, linewidth=1, label=label)


def heat_map(
    path: str | os.PathLike, labels: Sequence[str], panels: Sequence[tuple[str, np.ndarray]]
) -> Path:
    """Saves a heat map of exponent histograms: rows by binary exponent, format ranges marked."""
    try:
        from matplotlib.colors import LogNorm
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(
            "Profile.plot needs matplotlib: pip install matplotlib "
            "(or pip install 'autoprec[plot]')."
        ) from error
    low, high = _occupied_exponent_range([matrix for _, matrix in panels])
    figure = Figure(figsize=(6 * len(panels), 1.5 + 0.25 * max(1, len(labels))))
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    image = None
    for axis, (title, matrix) in zip(axes, panels):
        first = low - numerics.HISTOGRAM_MIN_EXPONENT
        masked = np.ma.masked_less_equal(matrix[:, first : first + high - low + 1], 0.0)
        image = axis.imshow(
            masked,
            aspect="auto",
            interpolation="nearest",
            extent=(low - 0.5, high + 0.5, len(labels) - 0.5, -0.5),
            norm=LogNorm(vmin=1e-6, vmax=1.0),
            cmap="viridis",
        )
        _mark_format_ranges(axis, low, high)
        axis.set_title(title)
        axis.set_xlabel("binary exponent floor(log2|x|)")
        axis.set_yticks(range(len(labels)))
        axis.set_yticklabels(labels, fontsize=7)
    axes[0].legend(loc="lower left", fontsize=6)
    if image is not None:
        figure.colorbar(image, ax=list(axes), label="fraction of elements")
    destination = Path(path)
    destination.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(destination, dpi=100)
    return destination
