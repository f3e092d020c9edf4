"""`PrecisionPlan`: the compute dtype of every layer, with the evidence behind it, as a JSON value."""

from __future__ import annotations

import copy
import datetime
import difflib
import fnmatch
import json
import os
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from .._core.dtypes import (
    COMPUTE_DTYPES,
    FLOAT16,
    FLOAT32,
    POLICY_FOR_DTYPE,
    canonical_dtype,
    count_dtypes,
    dtype_of_policy,
)
from .._core.io import atomic_write_json, parse_json_text, read_json_file
from .._version import __version__
from ..errors import PlanError
from ..layers import LayerInfo, describe_model, layer_paths, model_fingerprint
from .diff import PlanDiff
from .rule import PlanRule, _coerce_rule
from .serialize import _FORMAT_NAME, FORMAT_VERSION, _plan_from_dict

#: Metadata slots that later stages fill; all start as `None` (or empty).
METADATA_SLOTS: tuple[str, ...] = (
    "hardware",
    "budget",
    "reference_metric",
    "measured_metric",
    "predicted_speedup",
    "measured_speedup",
    "loss_scale",
    "evidence",
    "search",
)


class PrecisionPlan:
    """The compute dtype of every layer of a model, plus the evidence behind the choice.

    A plan maps stable layer paths (see `autoprec.layers`) to `"float32"`,
    `"bfloat16"` or `"float16"`. Layers the plan does not name explicitly are
    resolved by ordered `rules` (globs on paths or class names), then by
    `default`. Pass-through layers (Flatten, Dropout, MaxPooling...) always follow
    the dtype of the layer that feeds them. Plans are values: every change
    returns a new plan.

    Args:
        layers: `{path: dtype}` explicit assignments.
        rules: ordered `PlanRule`s or dicts like `{"class": "Softmax", "dtype": "float32"}`.
        default: dtype for layers matched by nothing else.
        layer_info: `{path: LayerInfo}` describing the model the plan was made for.
        fingerprint: the model fingerprint (`autoprec.layers.model_fingerprint`).
        model_name: name of the model the plan was made for.
        metadata: values for `METADATA_SLOTS` (hardware, budget, metrics, evidence...).
        events: records of automatic changes made during training (guard promotions).
        created: ISO-8601 creation time; now if omitted.
        autoprec_version: version that created the plan; this one if omitted.

    Example:

    ```python
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16")
    plan = plan.with_dtype("dense_2", "float32")
    print(plan.summary())
    plan.save("plan.json")
    ```
    """

    def __init__(
        self,
        layers: Mapping[str, str] | None = None,
        *,
        rules: Iterable[PlanRule | Mapping[str, str]] = (),
        default: str = FLOAT32,
        layer_info: Mapping[str, LayerInfo] | None = None,
        fingerprint: str | None = None,
        model_name: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        events: Iterable[Mapping[str, Any]] = (),
        created: str | None = None,
        autoprec_version: str | None = None,
    ) -> None:
        self._default = canonical_dtype(default, "default")
        self._rules = tuple(_coerce_rule(rule, index) for index, rule in enumerate(rules))
        self._layer_info = MappingProxyType(dict(layer_info or {}))
        explicit = {
            str(path): canonical_dtype(dtype, f"layers[{path!r}]")
            for path, dtype in (layers or {}).items()
        }
        self._layers = MappingProxyType(self._derive_followers(explicit))
        self._fingerprint = fingerprint
        self._model_name = model_name
        full_metadata: dict[str, Any] = {slot: None for slot in METADATA_SLOTS}
        full_metadata["evidence"] = {}
        full_metadata.update(copy.deepcopy(dict(metadata or {})))
        self._metadata = full_metadata
        self._events = tuple(copy.deepcopy(dict(event)) for event in events)
        self._created = created or datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        )
        self._autoprec_version = autoprec_version or __version__

    # ------------------------------------------------------------------ construction

    @classmethod
    def uniform(cls, model, dtype: str, **kwargs: Any) -> PrecisionPlan:
        """Returns a plan giving every layer of `model` the same compute dtype.

        Args:
            model: a built Keras model.
            dtype: `"float32"`, `"bfloat16"` or `"float16"`.
            **kwargs: passed to the constructor (e.g. `metadata`).

        Returns:
            A `PrecisionPlan` naming every layer.

        Example:

        ```python
        plan = autoprec.PrecisionPlan.uniform(model, "bfloat16")
        ```
        """
        dtype = canonical_dtype(dtype)
        infos = describe_model(model)
        return cls(
            {path: dtype for path in infos},
            default=dtype,
            layer_info=infos,
            fingerprint=model_fingerprint(infos),
            model_name=model.name,
            **kwargs,
        )

    @classmethod
    def from_model(cls, model, **kwargs: Any) -> PrecisionPlan:
        """Returns a plan that records the model's current per-layer policies.

        Layers whose policy is not one of the three compute dtypes (e.g. an integer
        preprocessing layer) are recorded as float32.

        Args:
            model: a built Keras model.
            **kwargs: passed to the constructor.

        Returns:
            A `PrecisionPlan` naming every layer.
        """

        paths = layer_paths(model)
        infos = describe_model(model)
        explicit = {path: dtype_of_policy(layer.dtype_policy) for path, layer in paths.items()}
        plan = cls(
            explicit,
            default=dtype_of_policy(model.dtype_policy),
            layer_info=infos,
            fingerprint=model_fingerprint(infos),
            model_name=model.name,
            **kwargs,
        )
        # Record what the model really does, even for pass-through layers.
        plan._layers = MappingProxyType(explicit)
        return plan

    @classmethod
    def from_dtype_policy_map(cls, model, policy_map) -> PrecisionPlan:
        """Returns the plan that a Keras `DTypePolicyMap` describes for `model`.

        Args:
            model: a built Keras model.
            policy_map: a `keras.dtype_policies.DTypePolicyMap` keyed by Keras layer paths.

        Returns:
            A `PrecisionPlan`; layers the map does not cover get the map's default policy.
        """
        infos = describe_model(model)
        default = dtype_of_policy(policy_map.default_policy)
        explicit = {}
        for path, info in infos.items():
            key = info.keras_path or path
            explicit[path] = dtype_of_policy(policy_map[key])
        return cls(
            explicit,
            default=default,
            layer_info=infos,
            fingerprint=model_fingerprint(infos),
            model_name=model.name,
        )

    # ------------------------------------------------------------------ read access

    @property
    def layers(self) -> Mapping[str, str]:
        """Read-only `{path: dtype}` of the layers the plan names explicitly."""
        return self._layers

    @property
    def rules(self) -> tuple[PlanRule, ...]:
        """Ordered pattern rules applied to layers not named in `layers`."""
        return self._rules

    @property
    def default(self) -> str:
        """Dtype of layers matched neither by path nor by a rule."""
        return self._default

    @property
    def layer_info(self) -> Mapping[str, LayerInfo]:
        """Read-only `{path: LayerInfo}` of the model the plan was made for."""
        return self._layer_info

    @property
    def fingerprint(self) -> str | None:
        """Fingerprint of the model the plan was made for, if known."""
        return self._fingerprint

    @property
    def model_name(self) -> str | None:
        """Name of the model the plan was made for, if known."""
        return self._model_name

    @property
    def metadata(self) -> Mapping[str, Any]:
        """Read-only view of the metadata slots (hardware, budget, metrics, evidence...)."""
        return MappingProxyType(self._metadata)

    @property
    def events(self) -> tuple[Mapping[str, Any], ...]:
        """Automatic changes made while training with this plan (guard promotions)."""
        return tuple(MappingProxyType(event) for event in self._events)

    @property
    def created(self) -> str:
        """ISO-8601 creation time."""
        return self._created

    @property
    def autoprec_version(self) -> str:
        """Version of autoprec that created the plan."""
        return self._autoprec_version

    def dtype_for(self, path: str, class_name: str | None = None) -> str:
        """Returns the compute dtype for a layer: exact path, then rules in order, then default.

        Args:
            path: stable layer path.
            class_name: the layer's class name, used by class rules; looked up in
                `layer_info` when omitted.

        Returns:
            `"float32"`, `"bfloat16"` or `"float16"`.
        """
        if path in self._layers:
            return self._layers[path]
        if class_name is None and path in self._layer_info:
            class_name = self._layer_info[path].class_name
        for rule in self._rules:
            if rule.matches(path, class_name):
                return rule.dtype
        return self._default

    def resolve(self, infos: Mapping[str, LayerInfo]) -> dict[str, str]:
        """Returns the dtype of every layer in `infos`, followers taking their source's dtype.

        Args:
            infos: the model's layers, from `autoprec.layers.describe_model(model)`.

        Returns:
            `{path: dtype}` for every path in `infos`.
        """
        own = {
            path: self.dtype_for(path, info.class_name)
            for path, info in infos.items()
            if info.follows is None or (path in self._layers and not info.pass_through)
        }
        return _follow(own, infos, self._default)

    def dtype_counts(self) -> dict[str, int]:
        """Returns how many layers the plan gives each dtype (explicit entries)."""
        return count_dtypes(self._layers.values())

    @property
    def uses_float16(self) -> bool:
        """Whether any layer (or the default, or a rule) computes in float16."""
        return (
            FLOAT16 in self._layers.values()
            or self._default == FLOAT16
            or any(rule.dtype == FLOAT16 for rule in self._rules)
        )

    # ------------------------------------------------------------------ changes

    def with_dtype(self, path_or_glob: str, dtype: str) -> PrecisionPlan:
        """Returns a new plan in which the matching layers compute in `dtype`.

        An exact path also sets every layer under it (a container's sub-layers).
        A glob (`fnmatch` syntax; `*` crosses `/`) sets every matching layer.
        Pass-through layers keep following the layer that feeds them.

        Args:
            path_or_glob: a stable layer path or a glob over paths.
            dtype: `"float32"`, `"bfloat16"` or `"float16"`.

        Returns:
            A new `PrecisionPlan`.

        Raises:
            PlanError: if the path is unknown or the glob matches no layer.

        Example:

        ```python
        plan = plan.with_dtype("attention/*", "float32")
        ```
        """
        dtype = canonical_dtype(dtype)
        known = list(self._layer_info) or list(self._layers)
        if path_or_glob in known:
            matched = [
                path
                for path in known
                if path == path_or_glob or path.startswith(path_or_glob + "/")
            ]
        else:
            matched = [path for path in known if fnmatch.fnmatchcase(path, path_or_glob)]
        if not matched:
            raise PlanError(
                f"with_dtype: {path_or_glob!r} matches no layer of the plan"
                f"{_suggest(path_or_glob, known)}. Paths look like "
                f"{', '.join(repr(path) for path in known[:3])}; see plan.summary()."
            )
        own_info = self._layer_info
        followers = [path for path in matched if path in own_info and own_info[path].pass_through]
        if followers and len(followers) == len(matched):
            source = own_info[followers[0]].follows
            while source in own_info and own_info[source].pass_through and own_info[source].follows:
                source = own_info[source].follows
            raise PlanError(
                f"with_dtype: {followers[0]!r} is a pass-through layer "
                f"({own_info[followers[0]].class_name}); it follows the dtype of "
                f"{source!r}. Set {source!r} instead."
            )
        explicit = dict(self._layers)
        for path in matched:
            if path not in followers:
                explicit[path] = dtype
        return self._replace(layers=explicit)

    def with_rule(
        self, dtype: str, *, path: str | None = None, class_name: str | None = None
    ) -> PrecisionPlan:
        """Returns a new plan with a rule appended (applies to layers not named explicitly).

        Args:
            dtype: compute dtype for matching layers.
            path: glob on layer paths.
            class_name: glob on layer class names, e.g. `"Softmax"`.

        Returns:
            A new `PrecisionPlan`.
        """
        rule = _coerce_rule(
            {
                "dtype": dtype,
                **({"path": path} if path else {}),
                **({"class": class_name} if class_name else {}),
            },
            len(self._rules),
        )
        return self._replace(rules=(*self._rules, rule))

    def with_metadata(self, **values: Any) -> PrecisionPlan:
        """Returns a new plan with metadata slots set (e.g. `measured_metric=0.91`)."""
        metadata = copy.deepcopy(self._metadata)
        metadata.update(copy.deepcopy(values))
        return self._replace(metadata=metadata)

    def with_event(self, event: Mapping[str, Any]) -> PrecisionPlan:
        """Returns a new plan with an event (e.g. a guard promotion) appended."""
        return self._replace(events=(*self._events, dict(event)))

    def _replace(self, **changes: Any) -> PrecisionPlan:
        arguments = dict(
            layers=self._layers,
            rules=self._rules,
            default=self._default,
            layer_info=self._layer_info,
            fingerprint=self._fingerprint,
            model_name=self._model_name,
            metadata=self._metadata,
            events=self._events,
            created=self._created,
            autoprec_version=self._autoprec_version,
        )
        arguments.update(changes)
        layers = arguments.pop("layers")
        return PrecisionPlan(layers, **arguments)

    def _derive_followers(self, explicit: dict[str, str]) -> dict[str, str]:
        """Gives pass-through layers and nested models the dtype of what they follow."""
        if not self._layer_info:
            return explicit
        own = {
            path: dtype
            for path, dtype in explicit.items()
            if path not in self._layer_info or self._layer_info[path].follows is None
        }
        for path, info in self._layer_info.items():
            if info.follows is None and path not in own:
                own[path] = self._dtype_from_rules(path, info.class_name)
        derived = _follow(own, self._layer_info, self._default)
        return {path: derived.get(path, dtype) for path, dtype in {**explicit, **derived}.items()}

    def _dtype_from_rules(self, path: str, class_name: str | None) -> str:
        for rule in self._rules:
            if rule.matches(path, class_name):
                return rule.dtype
        return self._default

    # ------------------------------------------------------------------ comparison

    def diff(self, other: PrecisionPlan) -> PlanDiff:
        """Returns the layer-by-layer differences from this plan to `other`.

        Args:
            other: another `PrecisionPlan`.

        Returns:
            A `PlanDiff`; `str(diff)` is a readable listing, `bool(diff)` is whether they differ.
        """
        mine, theirs = self._layers, other.layers
        changed = tuple(
            (path, mine[path], theirs[path])
            for path in mine
            if path in theirs and mine[path] != theirs[path]
        )
        return PlanDiff(
            changed=changed,
            only_in_self=tuple(path for path in mine if path not in theirs),
            only_in_other=tuple(path for path in theirs if path not in mine),
            default_changed=(self._default, other.default)
            if self._default != other.default
            else None,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PrecisionPlan):
            return NotImplemented
        return (
            dict(self._layers) == dict(other.layers)
            and self._rules == other.rules
            and self._default == other.default
        )

    def __hash__(self) -> int:
        return hash((tuple(sorted(self._layers.items())), self._rules, self._default))

    def __repr__(self) -> str:
        counts = ", ".join(f"{dtype}={count}" for dtype, count in self.dtype_counts().items())
        name = f"{self._model_name!r}, " if self._model_name else ""
        return f"PrecisionPlan({name}{counts}, default={self._default!r})"

    # ------------------------------------------------------------------ Keras interop

    def to_dtype_policy_map(self):
        """Returns a Keras `DTypePolicyMap` keyed by Keras layer paths.

        Layers for which Keras has no path (e.g. the softmax inside
        `MultiHeadAttention`) cannot be addressed by a `DTypePolicyMap`; use
        `autoprec.apply_plan` to set those.

        Returns:
            A `keras.dtype_policies.DTypePolicyMap` whose default is the plan's default.
        """
        import keras

        policy_map = keras.dtype_policies.DTypePolicyMap(
            default_policy=keras.dtype_policies.get(POLICY_FOR_DTYPE[self._default])
        )
        for path, dtype in self._layers.items():
            info = self._layer_info.get(path)
            key = info.keras_path if info is not None and info.keras_path else path
            if key in policy_map:
                continue
            policy_map[key] = keras.dtype_policies.get(POLICY_FOR_DTYPE[dtype])
        return policy_map

    # ------------------------------------------------------------------ presentation

    def summary(self) -> str:
        """Returns a text table: path, class, dtype, parameters, and totals per dtype.

        Returns:
            The table as a string (print it).
        """
        rows = []
        for path, dtype in self._layers.items():
            info = self._layer_info.get(path)
            class_name = info.class_name if info else "?"
            parameters = info.parameters if info else 0
            note = f"follows {info.follows}" if info and info.follows and info.pass_through else ""
            rows.append((path, class_name, dtype, parameters, note))
        headers = ("layer", "class", "dtype", "params", "")
        widths = [
            max([len(headers[column])] + [len(str(row[column])) for row in rows])
            for column in range(4)
        ]
        lines = [
            f"PrecisionPlan for {self._model_name or 'model'} "
            f"(default {self._default}, {len(self._rules)} rule(s))",
            "  ".join(header.ljust(width) for header, width in zip(headers, widths)).rstrip(),
            "  ".join("-" * width for width in widths),
        ]
        for path, class_name, dtype, parameters, note in rows:
            lines.append(
                f"{path:<{widths[0]}}  {class_name:<{widths[1]}}  {dtype:<{widths[2]}}  "
                f"{parameters:>{widths[3]},}  {note}".rstrip()
            )
        total_parameters = sum(row[3] for row in rows) or 1
        lines.append("")
        for dtype in COMPUTE_DTYPES:
            count = sum(1 for row in rows if row[2] == dtype)
            parameters = sum(row[3] for row in rows if row[2] == dtype)
            lines.append(
                f"{dtype:<9} {count:>4} layers  {parameters:>12,} params "
                f"({100.0 * parameters / total_parameters:5.1f} %)"
            )
        for rule in self._rules:
            lines.append(f"rule: {rule.to_dict()}")
        if self._events:
            lines.append(f"{len(self._events)} event(s): see plan.events")
        return "\n".join(lines)

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        """Returns the plan as a JSON-ready dict (the format in `docs/plan-format.md`)."""
        layers = {}
        for path, dtype in self._layers.items():
            info = self._layer_info.get(path)
            entry: dict[str, Any] = {"dtype": dtype}
            if info is not None:
                entry.update(
                    {
                        "class": info.class_name,
                        "keras_path": info.keras_path,
                        "parameters": info.parameters,
                        "weight_shapes": [list(shape) for shape in info.weight_shapes],
                        "container": info.is_container,
                        "pass_through": info.pass_through,
                        "follows": info.follows,
                    }
                )
            layers[path] = entry
        return {
            "format": _FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "autoprec_version": self._autoprec_version,
            "created": self._created,
            "model": {"name": self._model_name, "fingerprint": self._fingerprint},
            "default": self._default,
            "rules": [rule.to_dict() for rule in self._rules],
            "layers": layers,
            "metadata": copy.deepcopy(self._metadata),
            "events": [copy.deepcopy(event) for event in self._events],
        }

    def to_json(self) -> str:
        """Returns the plan as indented JSON text."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def save(self, path: str | os.PathLike) -> None:
        """Writes the plan as JSON atomically (temp file in the same folder, fsync, rename).

        Args:
            path: destination file, conventionally `*.json`.
        """
        atomic_write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: Any, source: str = "<plan>") -> PrecisionPlan:
        """Builds a plan from a decoded JSON value, validating every field.

        Args:
            data: the decoded JSON object.
            source: what to call the input in error messages (a file name).

        Returns:
            A `PrecisionPlan`.

        Raises:
            PlanError: naming the field that is wrong and how to fix it.
        """
        return _plan_from_dict(cls, data, source)

    @classmethod
    def from_json(cls, text: str, source: str = "<plan JSON>") -> PrecisionPlan:
        """Parses a plan from JSON text (see `from_dict` for validation)."""
        return cls.from_dict(parse_json_text(text, PlanError, "precision plan", source), source)

    @classmethod
    def load(cls, path: str | os.PathLike) -> PrecisionPlan:
        """Reads a plan JSON file written by `save` (or by hand).

        Args:
            path: the JSON file.

        Returns:
            A `PrecisionPlan`.

        Raises:
            PlanError: if the file is missing, malformed, from a newer format, or
                has a wrong field; the message names the file and the field.
        """
        data = read_json_file(path, PlanError, "precision plan")
        return cls.from_dict(data, str(path))


def _follow(own: Mapping[str, str], infos: Mapping[str, LayerInfo], default: str) -> dict[str, str]:
    """Resolves followers (pass-through layers, nested models) to their source's dtype."""
    resolved = dict(own)

    def lookup(path: str, depth: int = 0) -> str:
        if path in resolved:
            return resolved[path]
        info = infos.get(path)
        if info is None or info.follows is None or depth > len(infos):
            return default
        value = lookup(info.follows, depth + 1)
        resolved[path] = value
        return value

    for path in infos:
        lookup(path)
    return {path: resolved[path] for path in infos if path in resolved}


def _suggest(name: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.5)
    return f" (did you mean {', '.join(repr(match) for match in close)}?)" if close else ""
