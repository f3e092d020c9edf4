"""`PrecisionPlan`: the compute dtype of every layer, with the evidence behind it, as a JSON value."""

from __future__ import annotations

import copy
import datetime
import difflib
import fnmatch
import json
import os
import warnings
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
from .rule import PlanRule, coerce_rule
from .serialize import FORMAT_NAME, FORMAT_VERSION, plan_from_dict

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
    `"bfloat16"` or `"float16"`: `plan.layers` holds the layers it decides, and
    every one of them can be changed with `with_dtype`. Layers that follow
    another (pass-through layers such as Flatten, Dropout, MaxPooling, and nested
    models) are not decided: they always take the dtype of the layer they follow,
    and `plan.followers` maps each to that layer. Layers the plan does not name
    are resolved by ordered `rules` (globs on paths or class names), then by
    `default`. Plans are values: every change returns a new plan.

    Args:
        layers: `{path: dtype}` explicit assignments; entries for layers that
            `layer_info` says follow another are ignored (their dtype is derived).
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
        self._rules = tuple(coerce_rule(rule, index) for index, rule in enumerate(rules))
        self._layer_info = MappingProxyType(dict(layer_info or {}))
        self._followers = MappingProxyType(
            {path: info.follows for path, info in self._layer_info.items() if info.follows}
        )
        explicit = {
            str(path): canonical_dtype(dtype, f"layers[{path!r}]")
            for path, dtype in (layers or {}).items()
        }
        self._layers = MappingProxyType(self._decisions(explicit))
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
        preprocessing layer) are recorded as float32. Layers that follow another
        (pass-through layers, nested models) are recorded in `followers`, as
        `apply_plan` sets them: with the dtype of the layer they follow.

        Args:
            model: a built Keras model.
            **kwargs: passed to the constructor.

        Returns:
            A `PrecisionPlan` naming every layer it decides.

        Example:

        ```python
        plan = autoprec.PrecisionPlan.from_model(model)
        ```
        """
        paths = layer_paths(model)
        infos = describe_model(model)
        explicit = {path: dtype_of_policy(layer.dtype_policy) for path, layer in paths.items()}
        return cls(
            explicit,
            default=dtype_of_policy(model.dtype_policy),
            layer_info=infos,
            fingerprint=model_fingerprint(infos),
            model_name=model.name,
            **kwargs,
        )

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
        """Read-only `{path: dtype}` of the layers the plan decides; each is a valid `with_dtype` path.

        Layers that follow another are in `followers` instead; `resolve()` gives
        every layer's dtype, followers included.
        """
        return self._layers

    @property
    def followers(self) -> Mapping[str, str]:
        """Read-only `{path: followed_path}` of the layers that take another layer's dtype.

        Pass-through layers (Flatten, Dropout, MaxPooling...) follow the layer
        that feeds them, nested models their first computing layer. They are not
        in `layers` and `with_dtype` refuses them alone; change the layer they follow.
        """
        return self._followers

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
            `"float32"`, `"bfloat16"` or `"float16"`; a follower's is the dtype of
            the layer it follows.
        """
        seen = set()
        while path not in self._layers and path in self._followers and path not in seen:
            seen.add(path)
            path, class_name = self._followers[path], None
        if path in self._layers:
            return self._layers[path]
        if class_name is None and path in self._layer_info:
            class_name = self._layer_info[path].class_name
        for rule in self._rules:
            if rule.matches(path, class_name):
                return rule.dtype
        return self._default

    def resolve(self, infos: Mapping[str, LayerInfo] | None = None) -> dict[str, str]:
        """Returns the dtype of every layer in `infos`, followers taking their source's dtype.

        Args:
            infos: the model's layers, from `autoprec.layers.describe_model(model)`;
                by default the layers the plan was made for (`layer_info`).

        Returns:
            `{path: dtype}` for every path in `infos`.

        Example:

        ```python
        plan.resolve()["dropout"]  # the dtype of the layer the Dropout follows
        ```
        """
        if infos is None:
            infos = self._layer_info
        own = {
            path: self.dtype_for(path, info.class_name)
            for path, info in infos.items()
            if info.follows is None or (path in self._layers and not info.pass_through)
        }
        return _follow(own, infos, self._default)

    def dtype_counts(self) -> dict[str, int]:
        """Returns how many of the layers the plan decides (`layers`) compute in each dtype."""
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
        Followers (`plan.followers`) keep following the layer that feeds them.
        Every key of `plan.layers` is a valid path here.

        Args:
            path_or_glob: a stable layer path or a glob over paths.
            dtype: `"float32"`, `"bfloat16"` or `"float16"`.

        Returns:
            A new `PrecisionPlan`.

        Raises:
            PlanError: if the path is unknown, the glob matches no layer, or it
                matches only followers (the message names the layer to set instead).

        Example:

        ```python
        plan = plan.with_dtype("attention/*", "float32")
        for path in plan.layers:
            plan = plan.with_dtype(path, "float16")
        ```
        """
        known = list(self._layer_info) or list(self._layers)
        if path_or_glob not in known and _is_dtype(path_or_glob) and not _is_dtype(dtype):
            raise PlanError(
                f"with_dtype({path_or_glob!r}, {dtype!r}): the layer comes first, the dtype "
                f"last; write with_dtype({dtype!r}, {path_or_glob!r})."
            )
        dtype = canonical_dtype(dtype)
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
        decided = [path for path in matched if path not in self._followers]
        if not decided:
            raise PlanError(f"with_dtype: {self._follower_message(matched[0])}")
        explicit = dict(self._layers)
        for path in decided:
            explicit[path] = dtype
        return self._replace(layers=explicit)

    def with_rule(
        self,
        *positional: str,
        path: str | None = None,
        class_name: str | None = None,
        dtype: str | None = None,
    ) -> PrecisionPlan:
        """Returns a new plan in which every layer the rule matches computes in `dtype`.

        Arguments are keyword-only: where (`path` and/or `class_name`), then the
        dtype, the order `with_dtype` reads. Layers the plan decides (`layers`)
        that match are set now; they need their class name, which plans made from
        a model (`uniform`, `from_model`, a search, a saved plan) hold in
        `layer_info`. The rule is also appended to `rules`, where it applies, in
        order, to layers the plan does not name. Followers keep following.

        Args:
            *positional: the old spelling `with_rule(dtype, ...)`, still accepted
                with a `DeprecationWarning`.
            path: glob on layer paths.
            class_name: glob on layer class names, e.g. `"Softmax"`.
            dtype: compute dtype for matching layers.

        Returns:
            A new `PrecisionPlan`.

        Raises:
            PlanError: if the rule has no `dtype` or neither glob; if the plan knows
                its model's layers and the rule matches none it decides; or if a
                class rule meets named layers whose class the plan does not know
                (the message says to use `with_dtype` for those).

        Example:

        ```python
        plan = plan.with_rule(class_name="Softmax", dtype="float32")
        ```
        """
        if positional:
            if len(positional) > 1 or dtype is not None:
                raise PlanError(
                    f"with_rule{tuple(positional)!r}: arguments are keyword-only, where first, "
                    "dtype last; write e.g. with_rule(class_name='Softmax', dtype='float32')."
                )
            dtype = positional[0]
            warnings.warn(
                f"with_rule({dtype!r}, ...) is deprecated: the dtype is now a keyword given "
                f"last, as in with_dtype(path, dtype); write with_rule(..., dtype={dtype!r}).",
                DeprecationWarning,
                stacklevel=2,
            )
        if dtype is None:
            raise PlanError(
                "with_rule: missing dtype; write e.g. with_rule(class_name='Softmax', "
                "dtype='float32')."
            )
        rule = coerce_rule(
            {
                "dtype": dtype,
                **({"path": path} if path is not None else {}),
                **({"class": class_name} if class_name is not None else {}),
            },
            len(self._rules),
        )
        explicit = dict(self._layers)
        explicit.update({target: rule.dtype for target in self._rule_targets(rule)})
        return self._replace(layers=explicit, rules=(*self._rules, rule))

    def _rule_targets(self, rule: PlanRule) -> list[str]:
        """Returns the layers the plan decides that `rule` matches; refuses what it cannot match."""
        if not self._layer_info:
            if rule.class_name is not None and self._layers:
                named = ", ".join(repr(path) for path in list(self._layers)[:3])
                raise PlanError(
                    f"with_rule: the plan names layers ({named}...) without their class names, "
                    f"so class_name={rule.class_name!r} cannot be matched against them. Set "
                    "those with plan.with_dtype(path, dtype), or make the plan from the model "
                    "(PrecisionPlan.uniform / from_model) so it knows each layer's class."
                )
            return [target for target in self._layers if rule.matches(target, None)]

        def class_of(target: str) -> str | None:
            info = self._layer_info.get(target)
            return info.class_name if info is not None else None

        targets = [target for target in self._layers if rule.matches(target, class_of(target))]
        if targets:
            return targets
        following = [target for target in self._followers if rule.matches(target, class_of(target))]
        if following:
            raise PlanError(
                f"with_rule: {rule} matches only followers: {self._follower_message(following[0])}"
            )
        classes = sorted({class_of(target) or "?" for target in self._layers})
        hint = _suggest(rule.class_name, classes) if rule.class_name else ""
        raise PlanError(
            f"with_rule: {rule} matches no layer of the plan{hint}; its classes are "
            f"{', '.join(classes[:8])}{'...' if len(classes) > 8 else ''} (see plan.summary())."
        )

    def _follower_message(self, path: str) -> str:
        """Says which layer `path` follows and what to set instead."""
        source = path
        seen = set()
        while source in self._followers and source not in seen:
            seen.add(source)
            source = self._followers[source]
        info = self._layer_info.get(path)
        kind = "a pass-through layer" if info is None or info.pass_through else "a nested model"
        class_name = f" ({info.class_name})" if info is not None else ""
        return (
            f"{path!r} is {kind}{class_name}; it follows the dtype of {source!r}. "
            f"Set {source!r} instead."
        )

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

    def _decisions(self, explicit: dict[str, str]) -> dict[str, str]:
        """Returns the decided layers: explicit entries less followers, plus rule/default fill-ins."""
        if not self._layer_info:
            return explicit
        own = {path: dtype for path, dtype in explicit.items() if path not in self._followers}
        decided = {}
        for path in self._layer_info:
            if path in self._followers:
                continue
            decided[path] = own[path] if path in own else self._dtype_from_rules(path)
        decided.update({path: dtype for path, dtype in own.items() if path not in decided})
        return decided

    def _dtype_from_rules(self, path: str) -> str:
        class_name = self._layer_info[path].class_name
        for rule in self._rules:
            if rule.matches(path, class_name):
                return rule.dtype
        return self._default

    # ------------------------------------------------------------------ comparison

    def diff(self, other: PrecisionPlan) -> PlanDiff:
        """Returns what this plan and `other` decide differently: layers, rules and default.

        The diff is empty exactly when the plans are equal (`==` compares the
        same three things; metadata, events and layer descriptions are not decisions).

        Args:
            other: another `PrecisionPlan`.

        Returns:
            A `PlanDiff`; `str(diff)` is a readable listing, `bool(diff)` is whether they differ.

        Example:

        ```python
        print(plan.diff(plan.with_dtype("dense", "float32")))  # ~ dense  bfloat16 -> float32
        ```
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
            rules_changed=(self._rules, other.rules) if self._rules != other.rules else None,
        )

    def __eq__(self, other: object) -> bool:
        """Whether both plans decide the same: same `layers`, `rules` (in order) and `default`."""
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
        for path, dtype in self.resolve().items() if self._layer_info else self._layers.items():
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
        for path, dtype in self._every_layer().items():
            info = self._layer_info.get(path)
            class_name = info.class_name if info else "?"
            parameters = info.parameters if info else 0
            note = f"follows {self._followers[path]}" if path in self._followers else ""
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
        decided = [row for row in rows if row[0] in self._layers]
        total_parameters = sum(row[3] for row in decided) or 1
        lines.append("")
        for dtype in COMPUTE_DTYPES:
            count = sum(1 for row in decided if row[2] == dtype)
            parameters = sum(row[3] for row in decided if row[2] == dtype)
            lines.append(
                f"{dtype:<9} {count:>4} layers  {parameters:>12,} params "
                f"({100.0 * parameters / total_parameters:5.1f} %)"
            )
        if self._followers:
            lines.append(
                f"{len(self._followers)} follower(s) take the dtype of the layer they follow"
            )
        for rule in self._rules:
            lines.append(f"rule: {rule.to_dict()}")
        if self._events:
            lines.append(f"{len(self._events)} event(s): see plan.events")
        return "\n".join(lines)

    # ------------------------------------------------------------------ JSON

    def _every_layer(self) -> dict[str, str]:
        """Returns `{path: dtype}` of the decided layers and the followers, in the model's order."""
        if not self._layer_info:
            return dict(self._layers)
        resolved = self.resolve()
        resolved.update(
            {path: dtype for path, dtype in self._layers.items() if path not in resolved}
        )
        return resolved

    def to_dict(self) -> dict[str, Any]:
        """Returns the plan as a JSON-ready dict (the format in `docs/plan-format.md`).

        Followers are written too, with their derived dtype and `follows`, so the
        file lists every layer; reading derives their dtype again.
        """
        layers = {}
        for path, dtype in self._every_layer().items():
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
            "format": FORMAT_NAME,
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
        return plan_from_dict(cls, data, source)

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


def _is_dtype(value: object) -> bool:
    """Returns whether `value` is a dtype name autoprec accepts (aliases included)."""
    try:
        canonical_dtype(value)
    except PlanError:
        return False
    return True


def _suggest(name: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.5)
    return f" (did you mean {', '.join(repr(match) for match in close)}?)" if close else ""
