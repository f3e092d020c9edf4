"""The memory of decisions: the plan a fit ended with, recalled by the next run on this device."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
from pathlib import Path
from typing import Any

import keras

from .._core.io import atomic_write_json
from .._version import __version__
from ..cost import default_cache_dir
from ..cost.steps import framework_versions
from ..errors import PlanError
from ..layers import model_fingerprint
from ..plan import PrecisionPlan

logger = logging.getLogger("autoprec")

#: The version of the key's format: a change of format forgets every decision stored before.
KEY_FORMAT = 1

#: Steps a recalled plan runs before its step time is checked against the stored one.
RECALL_CHECK_STEPS = 10

#: The drift in step time beyond which a recalled plan is decided afresh (or the noise, if larger).
DRIFT = 0.10

#: The entries already warned about as unreadable in this process.
_WARNED: set[str] = set()


def memory_dir() -> Path:
    """Returns the folder decisions are stored in; deleting it forgets them all."""
    return default_cache_dir() / "decisions"


def decision_key(model: keras.Model, device: str, dtypes: list[str], settings: Any) -> dict:
    """Returns what a stored decision is valid for: device, versions, model, dtypes, settings."""
    config = {
        name: repr(value)
        for name, value in settings.get_config().items()
        if name not in ("x", "validation_data", "remember")
    }
    return {
        "format": KEY_FORMAT,
        "device": device,
        "cpus": os.cpu_count(),
        "versions": {**framework_versions(), "autoprec": __version__},
        "model": model_fingerprint(model),
        "dtypes": sorted(dtypes),
        "settings": config,
    }


def _entry_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()[:32]
    return memory_dir() / f"{digest}.json"


def recall(key: dict) -> dict | None:
    """Returns the entry stored under `key`, or `None` (an unreadable one is warned about once)."""
    path = _entry_path(key)
    if not path.exists():
        return None
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        entry["plan"] = PrecisionPlan.from_dict(entry["plan"], source=str(path))
        float(entry["step_ms"] or 0.0)
    except (OSError, ValueError, KeyError, TypeError, PlanError) as error:
        if str(path) not in _WARNED:
            _WARNED.add(str(path))
            logger.warning(
                "autoprec: %s: unreadable stored decision (%s); deciding afresh, and the "
                "entry is written again after this fit (delete it to forget it)",
                path,
                error,
            )
        return None
    return entry if entry.get("key") == key else None


def remember(key: dict, plan: PrecisionPlan, batch: Any, steps: list[float]) -> Path | None:
    """Stores `plan` with its step time (median and noise of `steps`, seconds) for the next run;
    fewer than `RECALL_CHECK_STEPS` steps time nothing a rerun could check against."""
    entry = {"key": key, "batch": batch, "plan": plan.to_dict(), "step_ms": None, "noise_ms": 0.0}
    if len(steps) >= RECALL_CHECK_STEPS:
        median = statistics.median(steps)
        noise = statistics.median(abs(step - median) for step in steps)
        entry.update(step_ms=round(1e3 * median, 4), noise_ms=round(2e3 * noise, 4))
    try:
        return atomic_write_json(_entry_path(key), entry)
    except OSError as error:
        logger.warning("autoprec: could not store the decision in %s (%s)", memory_dir(), error)
        return None


def drifted(entry: dict, step_seconds: float | None) -> str:
    """Returns why a recalled plan's step time drifted from the stored one, or `""`."""
    stored = entry.get("step_ms")
    if not stored or step_seconds is None:
        return ""
    allowed = max(DRIFT * stored, float(entry.get("noise_ms") or 0.0))
    if abs(1e3 * step_seconds - stored) <= allowed:
        return ""
    return (
        f"its step took {1e3 * step_seconds:.2f} ms against {stored:.2f} ms stored, beyond "
        f"{allowed:.2f} ms"
    )
