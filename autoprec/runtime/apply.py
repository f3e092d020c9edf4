"""`apply_plan`: set each layer's Keras dtype policy from a `PrecisionPlan`, and undo it."""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from collections.abc import Mapping

import keras

from .._core.dtypes import (
    FLOAT8,
    FLOAT16,
    canonical_float8_source,
    dtype_of_policy,
    is_float8_policy,
    policy_name,
)
from .._core.models import strategy_scope, sync_fit_state
from ..errors import PlanError
from ..layers import (
    LayerInfo,
    describe_model,
    is_fully_built,
    layer_paths,
    layer_policy,
    model_fingerprint,
    unprefixed_path,
)
from ..plan import PrecisionPlan
from .check import check_plan_runs
from .float8 import (
    has_float8_path,
    keep_nested_float8_policies,
    reset_float8_state,
    sync_float8_variables,
)
from .guard import Guard
from .policy_map import (
    align_graph_constants,
    lists_own_layers,
    skip_reason,
    unnamed_layer_dtypes,
    write_nested_policies,
)
from .telemetry import GuardTelemetry


@dataclasses.dataclass
class PlanHandle:
    """What `apply_plan` changed (the plan as applied, each layer's dtype and former policy, the
    layers `skipped` with why), and the way back (`restore`)."""

    model: keras.Model
    plan: PrecisionPlan
    dtypes: dict[str, str]
    original_policies: dict[str, object]
    skipped: dict[str, str]

    @property
    def uses_float16(self) -> bool:
        """Whether any layer now computes in float16, float8 sources included (needs loss scaling)."""
        dtypes = set(self.dtypes.values())
        return FLOAT16 in dtypes or (FLOAT8 in dtypes and self.plan.float8_source == FLOAT16)

    @property
    def uses_float8(self) -> bool:
        """Whether any layer now trains its matrix products in float8."""
        return FLOAT8 in self.dtypes.values()

    def restore(self) -> None:
        """Puts back every layer's original dtype policy and marks compiled functions stale."""
        sync_fit_state(self.model)
        paths = layer_paths(self.model)
        restored = []
        with strategy_scope(self.model):
            for path, policy in self.original_policies.items():
                layer = paths.get(path)
                if layer is not None:
                    layer.dtype_policy = policy
                    restored.append(layer)
        sync_float8_variables(restored)
        keep_nested_float8_policies(self.model)
        align_graph_constants(self.model)
        reset_compiled_functions(self.model)


#: The compiled functions Keras traces for a model, rebuilt when the policies change.
COMPILED_FUNCTIONS = ("train_function", "test_function", "predict_function")


def reset_compiled_functions(model: keras.Model) -> None:
    """Makes `fit`, `evaluate` and `predict` retrace so new dtype policies take effect."""
    for attribute in COMPILED_FUNCTIONS:
        if hasattr(model, attribute):
            setattr(model, attribute, None)


def check_plan_fits(
    plan: PrecisionPlan, infos: Mapping[str, LayerInfo], model_name: str
) -> list[str]:
    """Returns the problems that stop `plan` from applying exactly to a model."""
    problems = []
    unknown = [path for path in plan.layers if path not in infos]
    unnamed = [path for path in infos if path not in plan.layers and path not in plan.followers]
    if unknown:
        listed = []  # a renamed layer's counterpart is most likely a model layer the plan lacks
        for path in unknown[:10]:
            close = difflib.get_close_matches(path, unnamed, n=1, cutoff=0.4)
            close = close or difflib.get_close_matches(path, list(infos), n=1, cutoff=0.4)
            listed.append(f"{path!r}" + (f" (closest: {close[0]!r})" if close else ""))
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        problems.append(
            f"the plan names {len(unknown)} layer(s) that model {model_name!r} does not have: "
            f"{', '.join(listed)}{more}"
        )
    for path, planned in plan.layer_info.items():
        actual = infos.get(path)
        if actual is None:
            continue
        if planned.class_name != actual.class_name:
            problems.append(
                f"layer {path!r} is a {actual.class_name} in the model but a "
                f"{planned.class_name} in the plan"
            )
        elif planned.weight_shapes and actual.weight_shapes != planned.weight_shapes:
            problems.append(
                f"layer {path!r} has weight shapes {list(actual.weight_shapes)} in the model "
                f"but {list(planned.weight_shapes)} in the plan"
            )
    if not problems and plan.fingerprint and plan.layer_info and unnamed:
        problems.append(
            f"model {model_name!r} has {len(unnamed)} layer(s) the plan does not name, "
            f"e.g. {unnamed[0]!r}"
        )
    return problems


def apply_plan(
    model: keras.Model, plan: PrecisionPlan, strict: bool = True, *, x: object = None
) -> PlanHandle:
    """Sets every layer's dtype policy from `plan`; variables stay float32 (the master copy).

    Compute dtypes map to Keras policies `float32`, `mixed_bfloat16` and `mixed_float16`; float8
    to `float8_from_<source policy>` (bfloat16 unless `metadata["float8_source"]` says otherwise),
    whose scaling variables a compiled optimizer does not know: `AutoPrecision` rebuilds it with
    its state kept (`runtime/float8.extend_optimizer`; call it yourself before a `fit` without the
    callback). Policies are set on every layer, sub-layers included (Keras' setter does not cascade
    into containers such as `MultiHeadAttention`); nothing else is added, so the model computes as
    Keras rebuilds it from the saved file. A plan whose dtypes meet in a layer's own arithmetic is
    moved to one dtype by `AutoPrecision`'s check; `x=` refuses it here. Compiled functions are
    reset so the next `fit`/`evaluate`/`predict` retraces.

    Args:
        model: a built Keras model (call it once or use `AutoPrecision`, which applies the plan
            after `fit` has built the model).
        plan: the `PrecisionPlan` to apply.
        strict: if `True`, a plan naming layers the model lacks, or made for a model with other
            classes or weight shapes, raises `PlanError` and nothing is changed. If `False`, what
            matches is applied and the rest is reported with a warning.
        x: optionally, one batch of model inputs (any structure `fit` takes): the model is then
            run once on its first sample under the plan, and a plan that still cannot run is
            undone and refused with the layers that clash.

    Returns:
        A `PlanHandle`; `handle.restore()` puts the original policies back.

    Raises:
        PlanError: in strict mode, if the plan does not fit the model, or if the model is not
            built; with `x`, if the model cannot run under the plan.

    Example:

    ```python
    handle = autoprec.apply_plan(model, plan)
    model.fit(x, y)
    handle.restore()
    ```
    """
    if not isinstance(plan, PrecisionPlan):
        raise PlanError(
            f"apply_plan: expected a PrecisionPlan, got {type(plan).__name__}; "
            "load one with autoprec.PrecisionPlan.load(path)."
        )
    plan, infos = _checked_layers(model, plan, strict)
    dtypes = plan.resolve(infos)
    paths = layer_paths(model)
    sync_fit_state(model)  # inside JAX's fit: the variables are read and changed below
    _refuse_float8_without_a_path(paths, dtypes)
    source = canonical_float8_source(plan.metadata.get("float8_source"))
    original_policies, applied, skipped = _set_policies(model, paths, dtypes, source)
    sync_float8_variables(paths[path] for path in original_policies)
    keep_nested_float8_policies(model)
    for path, dtype in unnamed_layer_dtypes(model, applied).items():
        paths[path].dtype_policy = policy_name(dtype)  # as a reload from the policy map gives it
        applied[path] = dtype
    write_nested_policies(model)
    align_graph_constants(model)
    reset_compiled_functions(model)
    applied_plan = dataclasses.replace(
        plan,
        layers=applied,
        layer_info=infos,
        fingerprint=model_fingerprint(infos),
        model_name=model.name,
    )
    handle = PlanHandle(model, applied_plan, applied, original_policies, skipped)
    if x is not None:
        try:
            check_plan_runs(model, x)
        except PlanError:
            handle.restore()
            raise
    return handle


def _refuse_float8_without_a_path(
    paths: dict[str, keras.layers.Layer], dtypes: dict[str, str]
) -> None:
    """Raises `PlanError` naming the layers a plan gives float8 that have no float8 path."""
    no_float8 = [
        f"{path!r} ({type(layer).__name__})"
        for path, layer in paths.items()
        if dtypes.get(path) == FLOAT8 and not has_float8_path(layer)
    ]
    if no_float8:
        raise PlanError(
            f"apply_plan: {', '.join(no_float8[:3])} ha{'s' if len(no_float8) == 1 else 've'} "
            "no float8 path in Keras (only Dense and EinsumDense do); give "
            f"{'it' if len(no_float8) == 1 else 'them'} bfloat16, float16 or float32 in the plan."
        )


def _set_policies(
    model: keras.Model,
    paths: dict[str, keras.layers.Layer],
    dtypes: dict[str, str],
    source: str,
) -> tuple[dict[str, object], dict[str, str], dict[str, str]]:
    """Sets each layer's policy; returns the original policies, the dtypes set and the skipped."""
    original_policies: dict[str, object] = {}
    skipped: dict[str, str] = {}
    applied: dict[str, str] = {}
    with strategy_scope(model):  # float8 scaling variables are created here
        for path, layer in paths.items():
            reason = skip_reason(layer)
            if reason:
                skipped[path] = reason
                continue
            dtype = dtypes[path]
            original_policies[path] = layer_policy(layer)
            if lists_own_layers(layer):  # a reload rebuilds it in the default policy
                applied[path] = dtype_of_policy(original_policies[path])
                continue
            entering_float8 = dtype == FLOAT8 and not is_float8_policy(original_policies[path])
            layer.dtype_policy = policy_name(dtype, source)
            if entering_float8:
                reset_float8_state(layer)
            applied[path] = dtype
    return original_policies, applied, skipped


def _checked_layers(
    model: keras.Model, plan: PrecisionPlan, strict: bool
) -> tuple[PrecisionPlan, dict[str, LayerInfo]]:
    """The plan in the model's paths and the model's layers, once the model is built and the plan
    fits it (or `strict` is off)."""
    if not is_fully_built(model):
        message = (
            f"model {model.name!r} is not built, so its sub-layers have no weights or paths "
            "yet. Build it first (call it on one batch or model.build(input_shape)), or pass "
            "the plan to autoprec.AutoPrecision, which applies it once fit has built the model."
        )
        if strict:
            raise PlanError(message)
        warnings.warn(message, stacklevel=3)
    infos = describe_model(model)
    plan = _in_model_paths(plan, infos)
    problems = check_plan_fits(plan, infos, model.name)
    if problems:
        message = (
            f"plan for model {plan.model_name!r} does not fit model {model.name!r}: "
            + "; ".join(problems)
            + ". Re-create the plan for this model, or pass strict=False to apply what matches."
        )
        if strict:
            raise PlanError(message)
        warnings.warn(message, stacklevel=3)
    return plan, infos


def _in_model_paths(plan: PrecisionPlan, infos: Mapping[str, LayerInfo]) -> PrecisionPlan:
    """`plan` with paths that still carry a container's name before a sub-layer's own (plans
    written by 0.4: `backbone/backbone_3_embeddings`) as the model's paths now name them."""
    renamed = {
        path: unprefixed_path(path, plan.model_name or "")
        for path in [*plan.layers, *plan.layer_info]
        if path not in infos
    }
    renamed = {old: new for old, new in renamed.items() if new != old and new in infos}
    if not renamed:
        return plan
    layer_info = {
        renamed.get(path, path): dataclasses.replace(
            info, path=renamed.get(path, path), follows=renamed.get(info.follows, info.follows)
        )
        for path, info in plan.layer_info.items()
    }
    layers = {renamed.get(path, path): dtype for path, dtype in plan.layers.items()}
    return dataclasses.replace(plan, layers=layers, layer_info=layer_info)


#: The model attribute that holds its `AppliedState`.
APPLIED_ATTRIBUTE = "_autoprec_applied_plan"


@dataclasses.dataclass
class AppliedState:
    """What a model runs: the plan asked for and as applied, and what it was set up with."""

    requested: PrecisionPlan
    handle: PlanHandle
    guard: Guard | None
    optimizer: object
    unwrapped_optimizer: object
    telemetry: GuardTelemetry | None
    train_function: object

    def runs(self, model: keras.Model, plan: PrecisionPlan, guard: Guard | None) -> bool:
        """Whether `model` still runs `plan` as applied here, with nothing reset since."""
        return (
            model.train_function is not None
            and model.train_function is self.train_function
            and model.optimizer is self.optimizer
            and guard == self.guard
            and (self.telemetry is None or self.telemetry.installed)
            and (plan is self.requested or plan is self.handle.plan or plan == self.requested)
        )


def applied_state(model: keras.Model) -> AppliedState | None:
    """Returns the `AppliedState` kept on `model`, or `None` when no plan was applied by a callback."""
    return getattr(model, APPLIED_ATTRIBUTE, None)


def keep_applied_state(model: keras.Model, state: AppliedState | None) -> None:
    """Keeps `state` on `model` (bypassing Keras' attribute tracking); `None` removes it."""
    if state is not None:
        object.__setattr__(model, APPLIED_ATTRIBUTE, state)
    elif applied_state(model) is not None:
        object.__delattr__(model, APPLIED_ATTRIBUTE)
