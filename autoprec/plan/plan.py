"""`PrecisionPlan`: the compute dtype of every layer, with the evidence behind it, as a JSON value."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import os
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from .._core.dtypes import (
    FLOAT8,
    FLOAT16,
    FLOAT32,
    canonical_dtype,
    canonical_float8_source,
    count_dtypes,
    dtype_of_policy,
    float8_eligible,
)
from .._core.io import atomic_write_json, parse_json_text, read_json_file
from .._version import __version__
from ..errors import PlanError
from ..layers import LayerInfo, describe_model, layer_paths, layer_policy, model_fingerprint
from . import edits, keras_export, lookup, serialize
from .diff import PlanDiff, diff_plans
from .rules import PlanRule, coerce_rule, rule_from_arguments
from .summary import plan_summary

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
    "float8_source",
)


@dataclasses.dataclass(frozen=True, init=False, eq=False, repr=False)
class PrecisionPlan:
    """The compute dtype of every layer of a model, plus the evidence behind the choice.

    A plan maps stable layer paths (see `autoprec.layers`) to `"float32"`,
    `"bfloat16"`, `"float16"` or, for `Dense` and `EinsumDense` layers, `"float8"`
    (their matrix products in E4M3/E5M2 with delayed scaling, the rest of the layer in
    `float8_source`, bfloat16 unless `metadata["float8_source"]` says otherwise):
    `plan.layers` holds the layers it decides, and
    every one of them can be changed with `with_dtype`. Layers that follow
    another (pass-through layers such as Flatten, Dropout, MaxPooling, and nested
    models) are not decided: they always take the dtype of the layer they follow,
    and `plan.followers` maps each to that layer. Layers the plan does not name
    are resolved by ordered `rules` (globs on paths or class names), then by
    `default`. Plans are frozen values: every change returns a new plan.

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

    Attributes:
        layers: read-only `{path: dtype}` of the layers the plan decides, each a valid
            `with_dtype` path; `resolve()` gives every layer's dtype, followers included.
        followers: read-only `{path: followed_path}` of the layers that take another
            layer's dtype (pass-through layers, nested models); `with_dtype` refuses them.
        The other fields are the arguments, normalised: canonical dtypes, `PlanRule`s,
        read-only mappings and metadata slots, `created` and `autoprec_version` filled in.

    Example:

    ```python
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16")
    plan = plan.with_dtype("dense_2", "float32")
    print(plan.summary())
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
        _check_float8_layers(explicit, infos)
        decided = lookup.decided_layers(explicit, rules, default, infos, followers)
        full_metadata: dict[str, Any] = {slot: None for slot in METADATA_SLOTS}
        full_metadata["evidence"] = {}
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

        `"float8"` means float8 wherever Keras allows it: every `Dense` and
        `EinsumDense` layer in float8, every other layer in the float8 source dtype
        (bfloat16, or `metadata={"float8_source": "float16"}`).

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
        explicit = {
            path: dtype_of_policy(layer_policy(layer)) for path, layer in layer_paths(model).items()
        }
        default = dtype_of_policy(model.dtype_policy)
        return cls._for_model(model, describe_model(model), explicit, default, **kwargs)

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
        explicit, default = keras_export.dtypes_from_policy_map(infos, policy_map)
        return cls._for_model(model, infos, explicit, default)

    @classmethod
    def _for_model(
        cls, model, infos: dict[str, LayerInfo], layers: dict[str, str], default: str, **kwargs: Any
    ) -> PrecisionPlan:
        fingerprint = model_fingerprint(infos)
        return cls(
            layers,
            default=default,
            layer_info=infos,
            fingerprint=fingerprint,
            model_name=model.name,
            **kwargs,
        )

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
        return lookup.dtype_for(self, path, class_name)

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
        return lookup.resolve(self, infos)

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

        An exact path also sets every layer under it (a container's sub-layers).
        A glob (`fnmatch` syntax; `*` crosses `/`) sets every matching layer.
        Followers (`plan.followers`) keep following the layer that feeds them.
        Every key of `plan.layers` is a valid path here.

        Args:
            path_or_glob: a stable layer path or a glob over paths.
            dtype: `"float32"`, `"bfloat16"`, `"float16"` or `"float8"` (a glob then
                sets the matching `Dense`/`EinsumDense` layers only).

        Returns:
            A new `PrecisionPlan`.

        Raises:
            PlanError: if the path is unknown, the glob matches no layer, or it
                matches only followers (the message names the layer to set instead);
                for float8, if it names a layer without a float8 path.

        Example:

        ```python
        plan = plan.with_dtype("attention/*", "float32")
        for path in plan.layers:
            plan = plan.with_dtype(path, "float16")
        ```
        """
        return dataclasses.replace(self, layers=edits.layers_with_dtype(self, path_or_glob, dtype))

    def with_rule(
        self, *, path: str | None = None, class_name: str | None = None, dtype: str | None = None
    ) -> PrecisionPlan:
        """Returns a new plan in which every layer the rule matches computes in `dtype`.

        Arguments are keyword-only: where (`path` and/or `class_name`), then the
        dtype, the order `with_dtype` reads. Layers the plan decides (`layers`)
        that match are set now; they need their class name, which plans made from
        a model (`uniform`, `from_model`, a search, a saved plan) hold in
        `layer_info`. The rule is also appended to `rules`, where it applies, in
        order, to layers the plan does not name. Followers keep following.

        Args:
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
        rule = rule_from_arguments(path, class_name, dtype, len(self.rules))
        layers = edits.layers_with_rule(self, rule)
        return dataclasses.replace(self, layers=layers, rules=(*self.rules, rule))

    def with_metadata(self, **values: Any) -> PrecisionPlan:
        """Returns a new plan with metadata slots set (e.g. `measured_metric=0.91`)."""
        return dataclasses.replace(self, metadata={**self.metadata, **values})

    def with_event(self, event: Mapping[str, Any]) -> PrecisionPlan:
        """Returns a new plan with an event (e.g. a guard promotion) appended."""
        return dataclasses.replace(self, events=(*self.events, event))

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
        return diff_plans(self, other)

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
        """Returns a Keras `DTypePolicyMap` keyed by Keras layer paths.

        Layers for which Keras has no path (e.g. the softmax inside
        `MultiHeadAttention`) cannot be addressed by a `DTypePolicyMap`; use
        `autoprec.apply_plan` to set those.

        Returns:
            A `keras.dtype_policies.DTypePolicyMap` whose default is the plan's default.
        """
        return keras_export.to_dtype_policy_map(self)

    def summary(self) -> str:
        """Returns a text table: path, class, dtype, parameters, and totals per dtype.

        Returns:
            The table as a string (print it).
        """
        return plan_summary(self)

    def to_dict(self) -> dict[str, Any]:
        """Returns the plan as a JSON-ready dict (the format in `docs/plan-format.md`).

        Followers are written too, with their derived dtype and `follows`, so the
        file lists every layer; reading derives their dtype again.
        """
        return serialize.plan_to_dict(self)

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
        return serialize.plan_from_dict(cls, data, source)

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
        return cls.from_dict(read_json_file(path, PlanError, "precision plan"), str(path))


def _check_float8_layers(explicit: Mapping[str, str], infos: Mapping[str, LayerInfo]) -> None:
    """Refuses float8 on a layer whose class has no float8 path, naming the layer."""
    refused = [
        f"{path!r} ({infos[path].class_name})"
        for path, dtype in explicit.items()
        if dtype == FLOAT8 and path in infos and not float8_eligible(infos[path].class_name)
    ]
    if refused:
        raise PlanError(
            f"layers: float8 is only for Dense and EinsumDense layers (Keras has no float8 "
            f"path elsewhere), but it is set on {', '.join(refused[:5])}"
            + (f" and {len(refused) - 5} more" if len(refused) > 5 else "")
            + "; give those layers bfloat16, float16 or float32."
        )
