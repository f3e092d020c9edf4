"""The plan JSON format: its version, its layer entries, and reading it with errors that name the
file and the field."""

from __future__ import annotations

from typing import Any

from .._core.dtypes import FLOAT32, canonical_dtype
from ..errors import PlanError
from ..layers import LayerInfo
from .rules import coerce_rule

#: Version of the plan JSON format written by this release; newer files are refused.
FORMAT_VERSION = 1

#: The `format` field of a plan file, which tells a plan from a profile or another JSON file.
FORMAT_NAME = "autoprec.plan"


def layer_entry(info: LayerInfo) -> dict[str, Any]:
    """Returns the description of a layer written beside its dtype."""
    return {
        "class": info.class_name,
        "keras_path": info.keras_path,
        "parameters": info.parameters,
        "weight_shapes": [list(shape) for shape in info.weight_shapes],
        "container": info.is_container,
        "pass_through": info.pass_through,
        "follows": info.follows,
    }


def _expect(value: Any, kind: type, field: str, source: str, optional: bool = False) -> Any:
    """Returns `value` if it is a `kind` (not a bool for `int`), or `None` where `optional`."""
    if (optional and value is None) or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise PlanError(
        f"{source}: field '{field}' must be {kind.__name__}, got {type(value).__name__} ({value!r:.60})."
    )


def plan_arguments(data: Any, source: str) -> dict[str, Any]:
    """Returns the `PrecisionPlan` constructor arguments a decoded plan JSON value describes."""
    _expect(data, dict, "<top level>", source)
    _check_format(data, source)
    default = canonical_dtype(data.get("default", FLOAT32), f"{source}: default")
    rules = [
        coerce_rule(rule, index, source)
        for index, rule in enumerate(_expect(data.get("rules", []), list, "rules", source))
    ]
    explicit, infos = _read_layers(_expect(data.get("layers", {}), dict, "layers", source), source)
    return {
        "layers": explicit,
        "rules": rules,
        "default": default,
        "layer_info": infos if len(infos) == len(explicit) else {},
        **_read_record(data, source),
    }


def _check_format(data: dict, source: str) -> None:
    """Refuses a file without a `format_version` this release reads, or of another format."""
    version = data.get("format_version")
    if version is None:
        raise PlanError(
            f"{source}: missing 'format_version'; a plan file starts with "
            f'"format_version": {FORMAT_VERSION}.'
        )
    _expect(version, int, "format_version", source)
    if version > FORMAT_VERSION:
        raise PlanError(
            f"{source}: format_version {version} is newer than this autoprec supports "
            f"({FORMAT_VERSION}); upgrade autoprec (pip install -U autoprec)."
        )
    if version < 1:
        raise PlanError(f"{source}: format_version {version} is not valid; use {FORMAT_VERSION}.")
    if "format" in data and data["format"] != FORMAT_NAME:
        raise PlanError(
            f"{source}: field 'format' is {data['format']!r}, expected {FORMAT_NAME!r}; "
            "is this a profile or another file?"
        )


def _read_layers(layers_data: dict, source: str) -> tuple[dict[str, str], dict[str, LayerInfo]]:
    """Returns `({path: dtype}, {path: LayerInfo})` of the `layers` field (infos where given)."""
    explicit: dict[str, str] = {}
    infos: dict[str, LayerInfo] = {}
    for path, entry in layers_data.items():
        field = f"layers[{path!r}]"
        if isinstance(entry, str):
            explicit[path] = canonical_dtype(entry, f"{source}: {field}")
            continue
        _expect(entry, dict, field, source)
        if "dtype" not in entry:
            raise PlanError(f'{source}: {field} has no \'dtype\'; add e.g. "dtype": "bfloat16".')
        explicit[path] = canonical_dtype(entry["dtype"], f"{source}: {field}.dtype")
        if "class" in entry:
            infos[path] = _layer_info_from_entry(path, entry, field, source)
    return explicit, infos


def _read_record(data: dict, source: str) -> dict[str, Any]:
    """Returns the plan's record (model, metadata, events, creation) as constructor arguments."""
    model = _expect(data.get("model", {}) or {}, dict, "model", source)
    fingerprint = _expect(model.get("fingerprint"), str, "model.fingerprint", source, True)
    metadata = _expect(data.get("metadata", {}) or {}, dict, "metadata", source)
    _expect(metadata.get("evidence"), dict, "metadata.evidence", source, optional=True)
    events = _expect(data.get("events", []) or [], list, "events", source)
    for index, event in enumerate(events):
        _expect(event, dict, f"events[{index}]", source)
    return {
        "fingerprint": fingerprint,
        "model_name": model.get("name"),
        "metadata": metadata,
        "events": events,
        "created": _expect(data.get("created"), str, "created", source, optional=True),
        "autoprec_version": data.get("autoprec_version"),
    }


def _layer_info_from_entry(path: str, entry: dict, field: str, source: str) -> LayerInfo:
    class_name = _expect(entry["class"], str, f"{field}.class", source)
    parameters = _expect(entry.get("parameters", 0), int, f"{field}.parameters", source)
    shapes = _expect(entry.get("weight_shapes", []), list, f"{field}.weight_shapes", source)
    try:
        weight_shapes = tuple(tuple(int(d) for d in shape) for shape in shapes)
    except (TypeError, ValueError):
        raise PlanError(
            f"{source}: field '{field}.weight_shapes' must be a list of integer lists."
        ) from None
    return LayerInfo(
        path=path,
        class_name=class_name,
        parameters=parameters,
        weight_shapes=weight_shapes,
        is_container=bool(entry.get("container", False)),
        pass_through=bool(entry.get("pass_through", False)),
        follows=_expect(entry.get("follows"), str, f"{field}.follows", source, optional=True),
        keras_path=_expect(entry.get("keras_path"), str, f"{field}.keras_path", source, True),
    )
