"""The GPU benchmark's host record and results table (`bench/gpu.py`)."""

from __future__ import annotations

import os
import sys
from typing import Any

import jax
import keras
from common.host import cores, cpu_model, sixteen_bit_flags
from common.timing import STATISTICS
from gpu_memory import memory_stats
from gpu_workloads import CANDIDATES

import autoprec


def host() -> dict[str, Any]:
    """The CPU's model name and 16-bit flags (`lscpu`), the devices and the versions."""
    stats = memory_stats()
    device = jax.devices()[0]
    try:
        detected = autoprec.hardware.detect()
        hardware = {
            key: getattr(detected, key, None)
            for key in ("name", "display_name", "kind", "compute_capability", "fast_dtypes",
                        "slow_dtypes", "memory_bytes", "source")
        }  # fmt: skip
    except Exception as error:  # noqa: BLE001 - recorded, not needed
        hardware = {"error": f"{type(error).__name__}: {error}"}
    return {
        "cpu": cpu_model(),
        "cpu_16bit_flags": sixteen_bit_flags(),
        "cores": cores(),
        "keras_backend": keras.backend.backend(),
        "keras": keras.__version__,
        "jax": jax.__version__,
        "autoprec": autoprec.__version__,
        "python": sys.version.split()[0],
        "devices": [str(device) for device in jax.devices()],
        "device_kind": device.device_kind,
        "device_compute_capability": getattr(device, "compute_capability", None),
        "device_bytes_limit": stats.get("bytes_limit") if stats else None,
        "autoprec_hardware": hardware,
        "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
        "tensorflow_imported": sys.modules.get("tensorflow") is not None,
    }


def megabytes(value: Any) -> str:
    return f"{value / 2**20:.1f}" if isinstance(value, (int, float)) else "-"


def table(results: dict[str, Any]) -> str:
    """The results table: ms per step, ratio to the best uniform policy, memory, largest batch."""
    header = (
        f"{'model':<12} {'candidate':<15} {'ms min':>9} {'median':>9} {'/best min':>9} "
        f"{'/best med':>9} {'xla MB':>9} {'peak MB':>9} {'max batch':>14}"
    )
    lines = [header]
    for name, row in results["models"].items():
        for candidate in CANDIDATES:
            timing = row.get("candidates", {}).get(candidate, {})
            memory = row.get("memory", {}).get(candidate, {})
            ratio = (row.get("ratios") or {}).get(candidate) or {}
            if "ms_min" in timing:
                cells = f"{timing['ms_min']:9.2f} {timing['ms_median']:9.2f}"
            else:
                cells = f"{'ERROR':>9} {'':>9}"
            ratios = " ".join(
                f"{ratio[statistic]:8.3f}x" if statistic in ratio else f"{'':>9}"
                for statistic in STATISTICS
            )
            if "max_batch" in memory:
                mark = {"oom": "", "cap": ">=", "time": ">="}.get(memory["max_batch_bound"], "")
                batch = f"{mark}{memory['max_batch']} ({memory['max_batch_bound']})"
            else:
                batch = "ERROR" if "error" in memory else "-"
            lines.append(
                f"{name:<12} {candidate:<15} {cells} {ratios} "
                f"{megabytes(memory.get('xla_bytes')):>9} {megabytes(memory.get('peak_bytes')):>9} "
                f"{batch:>14}"
            )
        best = row.get("best_uniform", {})
        lines.append(
            f"{'':<12} best uniform: {best.get('min')} (min), {best.get('median')} (median)"
        )
        for plan, info in row.get("plans", {}).items():
            counts = info.get("composition")
            if counts:
                text = ", ".join(f"{count} {dtype}" for dtype, count in counts.items())
                lines.append(f"{'':<12} {plan} plan: {text}")
        failed = [stage for stage, entry in row.get("stages", {}).items() if "error" in entry]
        if failed or "error" in row:
            lines.append(f"{'':<12} FAILED: {', '.join(failed) or row.get('error', '')[:200]}")
    overflow = results.get("attention_overflow")
    if overflow:
        cells = []
        for candidate, figures in overflow.get("candidates", {}).items():
            state = "finite" if figures.get("finite") else "NON-FINITE"
            cells.append(f"{candidate} {state}")
        lines.append(
            f"attention overflow (max q·k {overflow.get('logits_amax', float('nan')):.3g}): "
            + ", ".join(cells)
            + f" -> {'PASS' if overflow.get('passed') else 'FAIL'}"
        )
    process = results.get("memory_process", {})
    settings = results.get("settings", {})
    lines.append(
        f"ms: whole train step (train_on_batch), {settings.get('rounds')} interleaved rounds of "
        f"{settings.get('steps')} steps; memory process status {process.get('status')} "
        f"({process.get('seconds', 0):.0f} s); peak MB '-' where the device keeps no statistics"
    )
    return "\n".join(lines)
