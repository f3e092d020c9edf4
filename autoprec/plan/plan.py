"""`PrecisionPlan`: the compute dtype of every layer, its lookup, edits, diff, summary and exports."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import difflib
import fnmatch
import json
import os
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from .._core.dtypes import (
    BFLOAT16,
    COMPUTE_DTYPES,
    FLOAT8,
    FLOAT16,
    FLOAT32,
    POLICY_FOR_DTYPE,
    canonical_dtype,
    canonical_float8_source,
    count_dtypes,
    dtype_of_policy,
    float8_eligible,
    policy_name,
)
from .._core.io import atomic_write_json, parse_json_text, read_json_file
from .._version import __version__
from ..errors import PlanError
from ..layers import LayerInfo, describe_model, layer_paths, layer_policy, model_fingerprint
from ..profiler.views import text_table
from .rules import (
    PlanRule,
    coerce_rule,
    did_you_mean,
    first_rule_dtype,
    followed_source,
    follower_message,
    rule_targets,
)
from .serialize import FORMAT_NAME, FORMAT_VERSION, layer_entry, plan_arguments

#: One summary row: path, class name, dtype, parameters, note (whom a follower follows).
Row = tuple[str, str, str, int, str]

_HEADERS = ("layer", "class", "dtype", "params")

#: Metadata slots that later stages fill; all start as `None` (or empty).
METADATA_SLOTS: tuple[str, ...] = tuple(
    """hardware budget reference_metric measured_metric predicted_speedup
    measured_speedup loss_scale evidence search float8_source""".split()
)


@dataclasses.dataclass(frozen=True)
class PlanDiff:
    """What two plans decide differently (`PrecisionPlan.diff`): changed layers as `(path, dtype in
    self, dtype in other)`, paths only in either, and the defaults and rules if they differ."""

    changed: tuple[tuple[str, str, str], ...]
    only_in_self: tuple[str, ...]
    only_in_other: tuple[str, ...]
    default_changed: tuple[str, str] | None
    rules_changed: tuple[tuple[PlanRule, ...], tuple[PlanRule, ...]] | None = None

    def __bool__(self) -> bool:
        fields = (self.changed, self.only_in_self, self.only_in_other, self.default_changed)
        return any(fields) or bool(self.rules_changed)

    def __str__(self) -> str:
        if not self:
            return "plans are identical"
        lines = []
        if self.default_changed:
            lines.append(f"default: {self.default_changed[0]} -> {self.default_changed[1]}")
        width = max([len(path) for path, _, _ in self.changed] + [5])
        for path, before, after in self.changed:
            lines.append(f"~ {path:<{width}}  {before} -> {after}")
        lines.extend(f"- {path}" for path in self.only_in_self)
        lines.extend(f"+ {path}" for path in self.only_in_other)
        if self.rules_changed:
            lines.extend(_rule_lines(*self.rules_changed))
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True, init=False, eq=False, repr=False)
class PrecisionPlan:
    """The compute dtype of every layer of a model, plus the evidence behind the choice.

    `layers` maps the stable paths the plan decides to `"float32"`, `"bfloat16"`, `"float16"`
    or, for `Dense`/`EinsumDense`, `"float8"` (the rest of such a layer in `float8_source`).
    `followers` maps pass-through layers and nested models to the layer whose dtype they take.
    Other layers get the first matching rule, then `default`. Every change returns a new plan.

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
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16").with_dtype("dense_2", "float32")
    plan.save("plan.json")
    ```
    """

    layers: Mapping[str, str]
    followers: Mapping[str, str] = dataclasses.field(init=False)
    rules: tuple[PlanRule, ...]
    default: str
    layer_info: Mapping[str, LayerInfo]
    fingerprint: str | None
    model_name: str | None
    metadata: Mapping[str, Any]
    events: tuple[Mapping[str, Any], ...]
    created: str
    autoprec_version: str

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
        default = canonical_dtype(default, "default")
        if default == FLOAT8:
            raise PlanError(
                "default: float8 cannot be a plan's default, because only Dense and "
                "EinsumDense layers have a float8 path; use PrecisionPlan.uniform(model, "
                "'float8') or a rule such as {'class': '*Dense', 'dtype': 'float8'}."
            )
        rules = tuple(coerce_rule(rule, index) for index, rule in enumerate(rules))
        infos = dict(layer_info or {})
        followers = {path: info.follows for path, info in infos.items() if info.follows}
        explicit = {
            str(path): canonical_dtype(dtype, f"layers[{path!r}]")
            for path, dtype in (layers or {}).items()
        }
        _float8_layers(
            "layers", [p for p, d in explicit.items() if d == FLOAT8 and p in infos], infos
        )
        decided = decided_layers(explicit, rules, default, infos, followers)
        full_metadata = {**dict.fromkeys(METADATA_SLOTS), "evidence": {}}
        full_metadata.update(copy.deepcopy(dict(metadata or {})))
        if full_metadata["float8_source"] is not None:
            full_metadata["float8_source"] = canonical_float8_source(
                full_metadata["float8_source"], "metadata['float8_source']"
            )
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        values = {
            "layers": MappingProxyType(decided),
            "followers": MappingProxyType(followers),
            "rules": rules,
            "default": default,
            "layer_info": MappingProxyType(infos),
            "fingerprint": fingerprint,
            "model_name": model_name,
            "metadata": MappingProxyType(full_metadata),
            "events": tuple(MappingProxyType(copy.deepcopy(dict(event))) for event in events),
            "created": created or now,
            "autoprec_version": autoprec_version or __version__,
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @classmethod
    def uniform(cls, model, dtype: str, **kwargs: Any) -> PrecisionPlan:
        """Returns a plan giving every layer of `model` the same compute dtype.

        `"float8"` puts every `Dense`/`EinsumDense` in float8 and every other layer in the
        float8 source dtype (bfloat16, or `metadata={"float8_source": "float16"}`).

        Args:
            model: a built Keras model.
            dtype: `"float32"`, `"bfloat16"`, `"float16"` or `"float8"`.
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
        if dtype != FLOAT8:
            return cls._for_model(model, infos, dict.fromkeys(infos, dtype), dtype, **kwargs)
        source = canonical_float8_source((kwargs.get("metadata") or {}).get("float8_source"))
        layers = {
            path: FLOAT8 if float8_eligible(info.class_name) else source
            for path, info in infos.items()
        }
        return cls._for_model(model, infos, layers, source, **kwargs)

    @classmethod
    def from_model(cls, model, **kwargs: Any) -> PrecisionPlan:
        """Returns a plan that records the model's current per-layer policies.

        Layers whose policy is no compute dtype (an integer preprocessing layer) are float32;
        layers that follow another are in `followers`, as `apply_plan` sets them.

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
        explicit = {
            path: dtype_of_policy(layer_policy(layer)) for path, layer in layer_paths(model).items()
        }
        default = dtype_of_policy(model.dtype_policy)
        return cls._for_model(model, describe_model(model), explicit, default, **kwargs)

    @classmethod
    def from_dtype_policy_map(cls, model, policy_map) -> PrecisionPlan:
        """Returns the plan a Keras `DTypePolicyMap` (keyed by Keras layer paths) describes for
        `model`; layers the map does not cover get its default policy."""
        infos = describe_model(model)
        explicit = {
            path: dtype_of_policy(policy_map[info.keras_path or path])
            for path, info in infos.items()
        }
        default = dtype_of_policy(policy_map.default_policy)
        return cls._for_model(model, infos, explicit, default)

    @classmethod
    def _for_model(
        cls, model, infos: dict[str, LayerInfo], layers: dict[str, str], default: str, **kwargs: Any
    ) -> PrecisionPlan:
        identity = {"fingerprint": model_fingerprint(infos), "model_name": model.name}
        return cls(layers, default=default, layer_info=infos, **identity, **kwargs)

    def dtype_for(self, path: str, class_name: str | None = None) -> str:
        """Returns a layer's compute dtype: exact path, then rules in order, then default (a
        follower's is that of the layer it follows; `class_name` from `layer_info` if omitted)."""
        follows = path in self.followers  # followers are never in `layers`
        if follows:
            path, class_name = followed_source(path, self.followers), None
        if path in self.layers:
            dtype = self.layers[path]
        else:
            if class_name is None and path in self.layer_info:
                class_name = self.layer_info[path].class_name
            dtype = first_rule_dtype(self.rules, path, class_name, self.default)
        return self.float8_source if follows and dtype == FLOAT8 else dtype

    def resolve(self, infos: Mapping[str, LayerInfo] | None = None) -> dict[str, str]:
        """Returns the dtype of every layer in `infos`, followers taking their source's dtype.

        Args:
            infos: `autoprec.layers.describe_model(model)`; by default `layer_info`.

        Returns:
            `{path: dtype}` for every path in `infos`.

        Example:

        ```python
        plan.resolve()["dropout"]  # the dtype of the layer the Dropout follows
        ```
        """
        if infos is None:
            infos = self.layer_info
        own = {
            path: self.dtype_for(path, info.class_name)
            for path, info in infos.items()
            if info.follows is None or (path in self.layers and not info.pass_through)
        }
        return resolve_followers(own, infos, self.default, self.float8_source)

    def _every_layer(self) -> dict[str, str]:
        """Returns `{path: dtype}` of the decided layers and the followers, in the model's order."""
        resolved = self.resolve()
        return {**resolved, **{p: d for p, d in self.layers.items() if p not in resolved}}

    def dtype_counts(self) -> dict[str, int]:
        """Returns how many of the layers the plan decides (`layers`) compute in each dtype."""
        return count_dtypes(self.layers.values())

    @property
    def float8_source(self) -> str:
        """The dtype of float8 layers' non-matmul work: `metadata["float8_source"]`, else bfloat16."""
        return canonical_float8_source(self.metadata.get("float8_source"))

    @property
    def uses_float8(self) -> bool:
        """Whether any layer (or a rule) trains its matrix products in float8."""
        return FLOAT8 in (*self.layers.values(), *(r.dtype for r in self.rules))

    @property
    def uses_float16(self) -> bool:
        """Whether any layer (or the default, or a rule) computes in float16, float8 sources included."""
        dtypes = {*self.layers.values(), self.default, *(r.dtype for r in self.rules)}
        return FLOAT16 in dtypes or (FLOAT8 in dtypes and self.float8_source == FLOAT16)

    def with_dtype(self, path_or_glob: str, dtype: str) -> PrecisionPlan:
        """Returns a new plan in which the matching layers compute in `dtype`.

        An exact path also sets every layer under it; a glob (`*` crosses `/`) every
        matching layer. Followers keep following the layer that feeds them.

        Args:
            path_or_glob: a stable layer path (any key of `plan.layers`) or a glob over paths.
            dtype: `"float32"`, `"bfloat16"`, `"float16"` or `"float8"` (`Dense`/`EinsumDense` only).

        Returns:
            A new `PrecisionPlan`.

        Raises:
            PlanError: if nothing but followers matches (naming the layer to set instead), or
                float8 names a layer without a float8 path.

        Example:

        ```python
        plan = plan.with_dtype("attention/*", "float32")
        ```
        """
        known = list(self.layer_info) or list(self.layers)
        if path_or_glob not in known and _is_dtype(path_or_glob) and not _is_dtype(dtype):
            raise PlanError(
                f"with_dtype({path_or_glob!r}, {dtype!r}): the layer comes first, the dtype "
                f"last; write with_dtype({dtype!r}, {path_or_glob!r})."
            )
        dtype = canonical_dtype(dtype)
        if path_or_glob in known:
            prefix = path_or_glob + "/"
            matched = [path for path in known if path == path_or_glob or path.startswith(prefix)]
        else:
            matched = [path for path in known if fnmatch.fnmatchcase(path, path_or_glob)]
        if not matched:
            raise PlanError(
                f"with_dtype: {path_or_glob!r} matches no layer of the plan"
                f"{did_you_mean(path_or_glob, known)}. Paths look like "
                f"{', '.join(repr(path) for path in known[:3])}; see plan.summary()."
            )
        decided = [path for path in matched if path not in self.followers]
        if not decided:
            message = follower_message(matched[0], self.followers, self.layer_info)
            raise PlanError(f"with_dtype: {message}")
        if dtype == FLOAT8 and self.layer_info:
            where = f"with_dtype({path_or_glob!r}, 'float8')"
            decided = _float8_layers(where, decided, self.layer_info, every=False)
        layers = {**self.layers, **dict.fromkeys(decided, dtype)}
        return dataclasses.replace(self, layers=layers)

    def with_rule(
        self, *, path: str | None = None, class_name: str | None = None, dtype: str | None = None
    ) -> PrecisionPlan:
        """Returns a new plan in which every layer the rule matches computes in `dtype`.

        Matching decided layers are set now (class rules need `layer_info`, which plans made
        from a model hold); the rule is appended to `rules` for the layers the plan does not name.

        Args:
            path: glob on layer paths.
            class_name: glob on layer class names, e.g. `"Softmax"`.
            dtype: compute dtype for matching layers.

        Returns:
            A new `PrecisionPlan`.

        Raises:
            PlanError: if the rule has no `dtype` or no glob, or matches no layer the plan decides.

        Example:

        ```python
        plan = plan.with_rule(class_name="Softmax", dtype="float32")
        ```
        """
        if dtype is None:
            raise PlanError(
                "with_rule: missing dtype; write e.g. with_rule(class_name='Softmax', dtype='float32')."
            )
        where = PlanRule(path=path, class_name=class_name, dtype=dtype).to_dict()
        rule = coerce_rule(where, len(self.rules))  # checks and names it as `rules[i]`
        targets = rule_targets(rule, self.layers, self.followers, self.layer_info)
        layers = {**self.layers, **dict.fromkeys(targets, rule.dtype)}
        return dataclasses.replace(self, layers=layers, rules=(*self.rules, rule))

    def with_metadata(self, **values: Any) -> PrecisionPlan:
        """Returns a new plan with metadata slots set (e.g. `measured_metric=0.91`)."""
        return dataclasses.replace(self, metadata={**self.metadata, **values})

    def with_event(self, event: Mapping[str, Any]) -> PrecisionPlan:
        """Returns a new plan with an event (e.g. a guard promotion) appended."""
        return dataclasses.replace(self, events=(*self.events, event))

    def diff(self, other: PrecisionPlan) -> PlanDiff:
        """Returns what this plan and `other` decide differently: layers, rules and default.

        Args:
            other: another `PrecisionPlan`.

        Returns:
            A `PlanDiff`, empty exactly when the plans are `==`.

        Example:

        ```python
        print(plan.diff(plan.with_dtype("dense", "float32")))  # ~ dense  bfloat16 -> float32
        ```
        """
        mine, theirs = self.layers, other.layers
        defaults = (self.default, other.default)
        return PlanDiff(
            changed=tuple(
                (path, mine[path], theirs[path])
                for path in mine
                if path in theirs and mine[path] != theirs[path]
            ),
            only_in_self=tuple(path for path in mine if path not in theirs),
            only_in_other=tuple(path for path in theirs if path not in mine),
            default_changed=defaults if defaults[0] != defaults[1] else None,
            rules_changed=(self.rules, other.rules) if self.rules != other.rules else None,
        )

    def __eq__(self, other: object) -> bool:
        """Whether both plans decide the same: same `layers`, `rules` (in order) and `default`."""
        if not isinstance(other, PrecisionPlan):
            return NotImplemented
        return (
            dict(self.layers) == dict(other.layers)
            and self.rules == other.rules
            and self.default == other.default
        )

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.layers.items())), self.rules, self.default))

    def __repr__(self) -> str:
        counts = ", ".join(f"{dtype}={count}" for dtype, count in self.dtype_counts().items())
        name = f"{self.model_name!r}, " if self.model_name else ""
        return f"PrecisionPlan({name}{counts}, default={self.default!r})"

    def to_dtype_policy_map(self):
        """Returns a Keras `DTypePolicyMap` keyed by Keras layer paths (a layer without one, such as
        the softmax inside `MultiHeadAttention`, by its own path: `apply_plan` sets those)."""
        import keras

        policies = keras.dtype_policies
        policy_map = policies.DTypePolicyMap(
            default_policy=policies.get(POLICY_FOR_DTYPE[self.default])
        )
        for path, dtype in (self.resolve() if self.layer_info else self.layers).items():
            info = self.layer_info.get(path)
            key = info.keras_path if info is not None and info.keras_path else path
            if key not in policy_map:
                policy_map[key] = policies.get(policy_name(dtype, self.float8_source))
        return policy_map

    def summary(self) -> str:
        """Returns a text table: path, class, dtype, parameters, and totals per dtype."""
        rows = []
        for path, dtype in self._every_layer().items():
            info = self.layer_info.get(path)
            note = f"follows {self.followers[path]}" if path in self.followers else ""
            class_name, parameters = (info.class_name, info.parameters) if info else ("?", 0)
            rows.append((path, class_name, dtype, parameters, note))
        title = (
            f"PrecisionPlan for {self.model_name or 'model'} "
            f"(default {self.default}, {len(self.rules)} rule(s))"
        )
        notes = [f"{len(self.followers)} follower(s) take the dtype of the layer they follow"]
        notes = notes[: bool(self.followers)] + [f"rule: {rule.to_dict()}" for rule in self.rules]
        notes += [f"{len(self.events)} event(s): see plan.events"][: bool(self.events)]
        decided = [row for row in rows if row[0] in self.layers]
        return "\n".join([title, *_table_lines(rows), "", *_total_lines(decided), *notes])

    def to_dict(self) -> dict[str, Any]:
        """Returns the plan as a JSON-ready dict (`docs/plan-format.md`), followers included."""
        layers = {}
        for path, dtype in self._every_layer().items():
            info = self.layer_info.get(path)
            layers[path] = {"dtype": dtype, **(layer_entry(info) if info is not None else {})}
        return {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "autoprec_version": self.autoprec_version,
            "created": self.created,
            "model": {"name": self.model_name, "fingerprint": self.fingerprint},
            "default": self.default,
            "rules": [rule.to_dict() for rule in self.rules],
            "layers": layers,
            "metadata": copy.deepcopy(dict(self.metadata)),
            "events": [copy.deepcopy(dict(event)) for event in self.events],
        }

    def to_json(self) -> str:
        """Returns the plan as indented JSON text."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def save(self, path: str | os.PathLike) -> None:
        """Writes the plan as JSON to `path` atomically (temp file in the same folder, fsync, rename)."""
        atomic_write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: Any, source: str = "<plan>") -> PrecisionPlan:
        """Builds a plan from a decoded JSON value; a `PlanError` names the wrong field and `source`."""
        arguments = plan_arguments(data, source)
        try:
            return cls(arguments.pop("layers"), **arguments)
        except PlanError as error:  # a refusal of the plan as a whole (float8 where it cannot go)
            message = str(error)
            raise PlanError(
                message if message.startswith(source) else f"{source}: {message}"
            ) from error

    @classmethod
    def from_json(cls, text: str, source: str = "<plan JSON>") -> PrecisionPlan:
        """Parses a plan from JSON text (see `from_dict` for validation)."""
        return cls.from_dict(parse_json_text(text, PlanError, "precision plan", source), source)

    @classmethod
    def load(cls, path: str | os.PathLike) -> PrecisionPlan:
        """Reads a plan JSON file written by `save` (or by hand); a `PlanError` names the file and
        the field of a missing, malformed or newer file."""
        return cls.from_dict(read_json_file(path, PlanError, "precision plan"), str(path))


def _float8_layers(
    where: str, paths: list[str], infos: Mapping[str, LayerInfo], every: bool = True
) -> list[str]:
    """Returns the `paths` float8 may go to (Dense, EinsumDense); refuses the others if `every`,
    else a list with none."""
    classes = {path: getattr(infos.get(path), "class_name", None) for path in paths}
    eligible = [path for path in paths if float8_eligible(classes[path])]
    refused = [path for path in paths if path not in eligible]
    if refused and (every or not eligible):
        named = ", ".join(f"{path!r} ({classes[path] or '?'})" for path in refused[:5])
        more = f" and {len(refused) - 5} more" if len(refused) > 5 else ""
        raise PlanError(
            f"{where}: float8 is only for Dense and EinsumDense layers (Keras has no float8 "
            f"path for {named}{more}); give them bfloat16, float16 or float32."
        )
    return eligible


def _rule_lines(before: tuple[PlanRule, ...], after: tuple[PlanRule, ...]) -> list[str]:
    """Returns the `- rules[i]: ...` / `+ rules[i]: ...` lines that turn `before` into `after`."""
    lines = []
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for tag, first_start, first_end, second_start, second_end in matcher.get_opcodes():
        if tag == "equal":
            continue
        for index in range(first_start, first_end):
            lines.append(f"- rules[{index}]: {before[index]}")
        for index in range(second_start, second_end):
            lines.append(f"+ rules[{index}]: {after[index]}")
    return lines


def decided_layers(
    explicit: Mapping[str, str],
    rules: tuple[PlanRule, ...],
    default: str,
    layer_info: Mapping[str, LayerInfo],
    followers: Mapping[str, str],
) -> dict[str, str]:
    """Returns the explicit layers less followers, with rule or default dtypes for the rest."""
    if not layer_info:
        return dict(explicit)
    own = {path: dtype for path, dtype in explicit.items() if path not in followers}
    decided = {
        path: own.get(path) or first_rule_dtype(rules, path, info.class_name, default)
        for path, info in layer_info.items()
        if path not in followers
    }
    return {**decided, **{path: dtype for path, dtype in own.items() if path not in decided}}


def resolve_followers(
    own: Mapping[str, str],
    infos: Mapping[str, LayerInfo],
    default: str,
    float8_source: str = BFLOAT16,
) -> dict[str, str]:
    """Returns `own` completed with each follower's dtype: that of the layer it follows."""
    resolved = dict(own)

    def lookup(path: str, depth: int = 0) -> str:
        if path in resolved:
            return resolved[path]
        info = infos.get(path)
        if info is None or info.follows is None or depth > len(infos):
            return default
        value = lookup(info.follows, depth + 1)
        value = float8_source if value == FLOAT8 else value
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


def _table_lines(rows: list[Row]) -> list[str]:
    """Returns the aligned table of `rows` (parameters right-aligned, notes after the columns)."""
    parameters = [f"{row[3]:,}" for row in rows]
    width = max(len(text) for text in [_HEADERS[3], *parameters])
    cells = [(*row[:3], text.rjust(width)) for row, text in zip(rows, parameters)]
    lines = text_table(_HEADERS, cells).splitlines()
    return lines[:2] + [f"{line}  {row[4]}".rstrip() for line, row in zip(lines[2:], rows)]


def _total_lines(decided: list[Row]) -> list[str]:
    """Returns one line per compute dtype: layers and parameters of the decided rows."""
    total = sum(row[3] for row in decided) or 1
    float8 = (FLOAT8,) if any(row[2] == FLOAT8 for row in decided) else ()
    lines = []
    for dtype in (*COMPUTE_DTYPES, *float8):
        rows = [row for row in decided if row[2] == dtype]
        parameters = sum(row[3] for row in rows)
        lines.append(
            f"{dtype:<9} {len(rows):>4} layers  {parameters:>12,} params "
            f"({100.0 * parameters / total:5.1f} %)"
        )
    return lines
