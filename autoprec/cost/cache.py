"""The calibration cache: one small JSON file per measurement, keyed by what was measured."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras

from .._core.io import atomic_write_json
from ..layers import model_fingerprint
from .layer_calls import LayerCall

_CACHE_FORMAT = 1


def default_cache_dir() -> Path:
    """Returns the cost cache folder: `$AUTOPREC_CACHE_DIR`, else `$XDG_CACHE_HOME/autoprec`."""
    configured = os.environ.get("AUTOPREC_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autoprec"


class MeasurementCache:
    """One small JSON file per measurement under `<dir>/costs/<device>/`, written atomically."""

    def __init__(self, directory: Path | None, device: str, versions: Mapping[str, str]):
        self.directory = None
        if directory is not None:
            slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "device"
            self.directory = Path(directory) / "costs" / slug
        self.device = device
        self.versions = dict(versions)

    def key(self, payload: Any) -> str:
        """Returns the file stem of a measurement: a hash of `payload`, the device and versions."""
        text = json.dumps(
            {"format": _CACHE_FORMAT, "device": self.device, "versions": self.versions, **payload},
            sort_keys=True,
            default=repr,
        )
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]

    def get(self, key: str) -> float | None:
        """Returns the cached seconds under `key`, or `None` (no cache, no entry, unreadable)."""
        if self.directory is None:
            return None
        file_path = self.directory / f"{key}.json"
        try:
            data = json.loads(file_path.read_text(encoding="utf-8"))
            return float(data["seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, seconds: float, description: str) -> None:
        """Writes `seconds` under `key` (nothing without a cache; a write error is ignored)."""
        if self.directory is None:
            return
        try:
            atomic_write_json(
                self.directory / f"{key}.json", {"seconds": seconds, "what": description}
            )
        except OSError:
            pass


def layer_signature(layer: keras.layers.Layer, call: LayerCall, batch_size: int) -> dict:
    """Returns what keys one layer's timing: class, config (no name or dtype), arguments, batch."""
    try:
        config = dict(layer.get_config())
    except Exception:
        config = {"unserialisable": type(layer).__qualname__}
    for field in ("name", "dtype", "trainable"):
        config.pop(field, None)
    return {
        "class": f"{type(layer).__module__}.{type(layer).__qualname__}",
        "config": config,
        "arguments": call.signature(),
        "batch_size": batch_size,
    }


def model_signature(model: keras.Model) -> Any:
    """Returns what keys a whole-step timing of `model`: its config, else its fingerprint."""
    try:
        return json.loads(json.dumps(model.get_config(), sort_keys=True, default=repr))
    except Exception:
        return {"fingerprint": model_fingerprint(model)}
