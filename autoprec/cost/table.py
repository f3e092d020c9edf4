"""The cost of every layer of one model in each dtype on one device, its JSON form, and the cache
of measurements (one small JSON file each, keyed by what was measured)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import keras

from .._core.dtypes import FLOAT32, PLAN_DTYPES
from .._core.io import atomic_write_json, read_json_file
from .._core.models import call_model_code
from ..errors import PlanError
from ..layers import model_fingerprint
from .layer_calls import LayerCall

_TABLE_FORMAT = 1

#: What a layer, or a model, whose own code cannot be configured or copied loses in calibration.
NOT_TIMED = "it is costed by prediction, not timed"
STEPS_NOT_TIMED = "its whole steps are not timed (no whole-step correction of the layer costs)"

#: `CostTable.relative_error` of a table whose predictions no whole step checked (a
#: roofline prediction for a hardware profile, or a calibration without mixed steps).
DEFAULT_RELATIVE_ERROR = 0.10


def _float_mapping(value: Any) -> dict[str, float]:
    """Returns `{str: float}` from a decoded JSON object (`{}` for a missing field)."""
    return {str(key): float(item) for key, item in dict(value or {}).items()}


#: How `CostTable.from_dict` reads each field, in the order its JSON writes them (after "format",
#: before edges and layers); a field not in `_REQUIRED_FIELDS` may be missing (older tables).
_FIELD_READERS: dict[str, Callable[[Any], Any]] = {
    "device": str, "source": str, "batch_size": int, "step_overhead_seconds": float,
    "layer_time_scale": float, "layer_fixed_seconds": float,
    "measured_step_seconds": lambda value: value, "memory_bytes": lambda value: value,
    "model_fingerprint": str, "versions": dict, "stats": dict,
    "measured_step_seconds_by_dtype": _float_mapping, "layer_time_scale_by_dtype": _float_mapping,
    "cast_seconds": lambda value: {key: dict(item) for key, item in value.items()},
    "boundary_seconds": lambda value: {
        str(key): _float_mapping(item) for key, item in dict(value or {}).items()
    },
    "measured_plan_seconds": _float_mapping, "relative_error": float,
    "prediction_errors": _float_mapping,
}  # fmt: skip
_REQUIRED_FIELDS = ("device", "source", "batch_size", "cast_seconds")


@dataclasses.dataclass
class LayerCostRecord:
    """Cost of one layer in each dtype for one batch (a row of a `CostTable`)."""

    path: str
    class_name: str
    seconds: dict[str, float | None]
    forward_flops: float
    backward_flops: float
    bytes_moved: dict[str, float]
    saved_elements_per_sample: float
    weight_elements: int
    source: str
    note: str = ""


@dataclasses.dataclass
class CostTable:
    """Per-layer, per-dtype forward+backward costs of one model on one device (see docs/api.md)."""

    device: str
    source: str
    batch_size: int
    layers: dict[str, LayerCostRecord]
    edges: list[tuple[str | None, str, int]]
    cast_seconds: dict[str, dict[str, float]]
    step_overhead_seconds: float = 0.0
    layer_time_scale: float = 1.0
    layer_fixed_seconds: float = 0.0
    measured_step_seconds: float | None = None
    memory_bytes: int | None = None
    model_fingerprint: str = ""
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    stats: dict[str, int] = dataclasses.field(default_factory=dict)
    measured_step_seconds_by_dtype: dict[str, float] = dataclasses.field(default_factory=dict)
    layer_time_scale_by_dtype: dict[str, float] = dataclasses.field(default_factory=dict)
    boundary_seconds: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    measured_plan_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    relative_error: float = DEFAULT_RELATIVE_ERROR
    prediction_errors: dict[str, float] = dataclasses.field(default_factory=dict)

    def time_scale(self, dtype: str) -> float:
        """Returns the factor on every layer time of `dtype`: its own where a whole step in `dtype`
        was measured, else `layer_time_scale`."""
        return float(self.layer_time_scale_by_dtype.get(dtype, self.layer_time_scale))

    def seconds(self, path: str, dtype: str, batch_size: int | None = None) -> float:
        """Returns a layer's forward+backward seconds in `dtype` times `time_scale(dtype)` (`inf`:
        infeasible), scaled to `batch_size` linearly above `layer_fixed_seconds`."""
        value = self.layers[path].seconds.get(dtype)
        if value is None:
            return math.inf
        if batch_size is not None and batch_size != self.batch_size and value != 0:
            fixed = min(self.layer_fixed_seconds, value)
            value = fixed + (value - fixed) * batch_size / self.batch_size
        return self.time_scale(dtype) * value

    def layer_seconds(self, path: str, dtype: str, batch_size: int | None = None) -> float | None:
        """Returns a layer's forward+backward seconds in `dtype` as `seconds` does, but `None` (not
        `inf`) where the table holds no time (no float8 path, an unsupported dtype, an unknown layer)."""
        record = self.layers.get(path)
        if record is None or record.seconds.get(dtype) is None:
            return None
        return self.seconds(path, dtype, batch_size)

    def cast_cost(self, elements: float, dtype: str) -> float:
        """Returns seconds to cast `elements` to `dtype` and the gradient back (fwd+bwd)."""
        figures = self.cast_seconds.get(dtype) or self.cast_seconds.get("bfloat16") or {}
        return 2.0 * (figures.get("fixed", 0.0) + figures.get("per_element", 0.0) * elements)

    def boundary_cost(self, elements: float, dtype: str) -> float:
        """Returns what a whole step adds at one boundary of `elements` values beyond its cast
        (fwd+bwd); a dtype without its own figures takes the mean of the others (0 if none)."""
        figures = self.boundary_seconds.get(dtype)
        if figures is None:
            known = list(self.boundary_seconds.values())
            if not known:
                return 0.0
            figures = {
                field: sum(item.get(field, 0.0) for item in known) / len(known)
                for field in ("fixed", "per_element")
            }
        return figures.get("fixed", 0.0) + figures.get("per_element", 0.0) * elements

    def to_dict(self) -> dict[str, Any]:
        """Returns the table as a JSON-serialisable dict."""
        data: dict[str, Any] = {"format": _TABLE_FORMAT}
        data.update({name: copy.deepcopy(getattr(self, name)) for name in _FIELD_READERS})
        data["edges"] = [list(edge) for edge in self.edges]
        data["layers"] = {path: dataclasses.asdict(record) for path, record in self.layers.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "cost table") -> CostTable:
        """Builds a table from `to_dict` output (older tables read with per-dtype corrections alike,
        no boundary cost); raises `PlanError` naming `source` when a field is malformed."""
        try:
            fields = {
                name: read(data[name])
                for name, read in _FIELD_READERS.items()
                if name in data or name in _REQUIRED_FIELDS
            }
            return cls(
                layers={path: LayerCostRecord(**row) for path, row in dict(data["layers"]).items()},
                edges=[(edge[0], edge[1], int(edge[2])) for edge in data["edges"]],
                **fields,
            )
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise PlanError(f"{source}: malformed cost table ({error!r}).") from None

    def save(self, path: str | os.PathLike) -> Path:
        """Writes the table to a JSON file atomically."""
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> CostTable:
        """Reads a table written by `save`."""
        return cls.from_dict(read_json_file(path, PlanError, "cost table"), source=str(path))

    def summary(self, limit: int = 40) -> str:
        """Returns a table of the most expensive layers' milliseconds per dtype."""
        dtypes = [
            dtype
            for dtype in PLAN_DTYPES
            if any(dtype in record.seconds for record in self.layers.values())
        ]
        rows = sorted(
            (record for record in self.layers.values() if any(record.seconds.values())),
            key=lambda record: -(record.seconds.get(FLOAT32) or 0.0),
        )[:limit]
        width = max([len(record.path) for record in rows] + [5])
        header = f"{'layer':<{width}}  " + "  ".join(f"{dtype:>9}" for dtype in dtypes)
        lines = [f"{self.source} costs on {self.device}, batch {self.batch_size} (ms)", header]
        for record in rows:
            values = [record.seconds.get(dtype) for dtype in dtypes]
            cells = [f"{'-' if value is None else f'{value * 1e3:.3f}':>9}" for value in values]
            lines.append(f"{record.path:<{width}}  " + "  ".join(cells))
        lines.append(f"step overhead {self.step_overhead_seconds * 1e3:.2f} ms")
        for dtype, measured in self.measured_step_seconds_by_dtype.items():
            lines.append(
                f"whole {dtype} step measured {measured * 1e3:.2f} ms; "
                f"{dtype} layer times x {self.time_scale(dtype):.3f}"
            )
        for name, measured in self.measured_plan_seconds.items():
            lines.append(f"whole {name} step measured {measured * 1e3:.2f} ms")
        for dtype, figures in self.boundary_seconds.items():
            lines.append(
                f"{dtype} boundary adds {figures.get('fixed', 0.0) * 1e6:.1f} us + "
                f"{figures.get('per_element', 0.0) * 1e9:.3f} ns per element"
            )
        lines.append(f"whole-step prediction error +/-{self.relative_error:.1%}")
        return "\n".join(lines)


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
        if self.directory is not None:
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                data = json.loads((self.directory / f"{key}.json").read_text(encoding="utf-8"))
                return float(data["seconds"])
        return None

    def measured(self, payload: Any, description: str, measure: Callable[[], float]) -> float:
        """Returns the seconds cached under `payload`, measured (and cached) the first time."""
        key = self.key(payload)
        seconds = self.get(key)
        if seconds is None:
            seconds = measure()
            self.put(key, seconds, description)
        return seconds

    def put(self, key: str, seconds: float, description: str) -> None:
        """Writes `seconds` under `key` (nothing without a cache; a write error is ignored)."""
        if self.directory is not None:
            with contextlib.suppress(OSError):
                entry = {"seconds": seconds, "what": description}
                atomic_write_json(self.directory / f"{key}.json", entry)


def layer_signature(layer: keras.layers.Layer, call: LayerCall, batch_size: int) -> dict:
    """Returns what keys one layer's timing: class, config (no name or dtype), arguments, batch."""
    config = call_model_code(
        lambda: dict(layer.get_config()),
        layer=call.path,
        lost=NOT_TIMED,
        fallback={"unserialisable": type(layer).__qualname__},
    )
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
    return call_model_code(
        lambda: json.loads(json.dumps(model.get_config(), sort_keys=True, default=repr)),
        layer=model.name,
        lost=STEPS_NOT_TIMED,
        fallback={"fingerprint": model_fingerprint(model)},
    )
