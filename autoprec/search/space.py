"""The search space: which layers, which dtypes each may take, their groups, and what a plan costs."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import keras

from .. import numerics
from .._core.dtypes import (
    BFLOAT16,
    FLOAT8,
    FLOAT16,
    FLOAT32,
    PLAN_DTYPES,
    canonical_dtype,
    float8_eligible,
)
from ..cost import CostTable, estimate
from ..hardware import HardwareProfile
from ..layers import LayerInfo, describe_model, is_pass_through, layer_paths, model_fingerprint
from ..plan import PrecisionPlan
from ..profiler import Profile, profile
from ..profiler.stats import ATTENTION_LOGITS

logger = logging.getLogger("autoprec")

#: Layer classes kept in float32 by the heuristic unless evidence says otherwise
#: (peers' op lists: exp, log, softmax and norms in float32).
SENSITIVE_CLASS_PATTERNS: tuple[str, ...] = ("Softmax", "*Normalization", "LayerNorm*", "RMSNorm*")

_BLOCK_TOKEN = re.compile(r"^block\d*$")


@dataclasses.dataclass(frozen=True)
class Group:
    """Layers that the search gives one dtype choice."""

    name: str
    paths: tuple[str, ...]
    choices: tuple[str, ...]


def compute_layers(infos: Mapping[str, LayerInfo]) -> list[str]:
    """Returns the paths that get a dtype of their own: not pass-through, not containers."""
    return [
        path
        for path, info in infos.items()
        if not info.pass_through and not info.is_container and info.follows is None
    ]


def output_layers(model: keras.Model, infos: Mapping[str, LayerInfo]) -> set[str]:
    """Returns the compute layers that produce the model's outputs (loss-adjacent)."""
    return set(output_paths(model, infos))


def output_paths(model: keras.Model, infos: Mapping[str, LayerInfo]) -> tuple[str, ...]:
    """Returns, for each of the model's outputs (flattened), the compute layer that produces it."""
    path_of = {id(layer): path for path, layer in layer_paths(model).items()}
    compute = compute_layers(infos)
    fallback = compute[-1] if compute else None
    tensors = keras.tree.flatten(getattr(model, "outputs", None) or [])
    found = [_producer(tensor, path_of, infos) or fallback for tensor in tensors] or [fallback]
    return tuple(path for path in found if path is not None)


def _producer(
    tensor: Any, path_of: Mapping[int, str], infos: Mapping[str, LayerInfo]
) -> str | None:
    """The compute layer that produces a symbolic tensor (through nested models and followers)."""
    for _ in range(50):
        history = getattr(tensor, "_keras_history", None)
        operation = getattr(history, "operation", None)
        path = path_of.get(id(operation)) if operation is not None else None
        if path is None:
            return None
        inner = getattr(operation, "outputs", None) if infos[path].is_container else None
        if not inner:
            break
        tensor = keras.tree.flatten(inner)[getattr(history, "tensor_index", 0)]
    return followed(path, infos)


def followed(path: str, infos: Mapping[str, LayerInfo]) -> str:
    """Returns the layer that a pass-through layer's chain of `follows` ends at (`path` itself else)."""
    for _ in range(50):
        follows = infos[path].follows if path in infos else None
        if not follows or follows not in infos:
            break
        path = follows
    return path


def is_sensitive(info: LayerInfo, patterns: Iterable[str] = SENSITIVE_CLASS_PATTERNS) -> bool:
    """Returns whether the layer's class matches `patterns` (default: softmax, normalisation)."""
    return any(fnmatch.fnmatchcase(info.class_name, pattern) for pattern in patterns)


def matches_any(path: str, info: LayerInfo, patterns: Iterable[str]) -> bool:
    """Returns whether a layer's path or class name matches one of the globs."""
    return any(
        fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(info.class_name, pattern)
        for pattern in patterns
    )


def _block_key(path: str) -> str | None:
    top = path.split("/", 1)[0]
    tokens = top.split("_")
    for index, token in enumerate(tokens):
        if _BLOCK_TOKEN.match(token):
            end = index + 1
            if token == "block" and end < len(tokens) and tokens[end].isdigit():
                end += 1
            return "_".join(tokens[:end])
    if "/" in path:
        return top
    return None


def group_layers(
    paths: Sequence[str],
    group_by: str | int,
    separate: Iterable[str] = (),
    max_groups: int = 32,
) -> list[list[str]]:
    """Splits compute layers (in model order) into groups of consecutive layers."""
    separate = set(separate)
    if group_by == "auto":
        group_by = "layer" if len(paths) <= 24 else "block"
    if group_by == "layer":
        return [[path] for path in paths]
    if isinstance(group_by, int) and not isinstance(group_by, bool):
        return _contiguous_chunks(paths, group_by, separate)
    if group_by != "block":
        raise ValueError(f"group_by must be 'layer', 'block', 'auto' or an int, got {group_by!r}.")
    groups: list[list[str]] = []
    previous_key: object = object()
    for path in paths:
        if path in separate:
            groups.append([path])
            previous_key = object()
            continue
        key = _block_key(path) or "<between blocks>"
        if key == previous_key and groups:
            groups[-1].append(path)
        else:
            groups.append([path])
        previous_key = key
    if len(groups) > max_groups:
        return _contiguous_chunks(paths, max_groups, separate)
    return groups


def _contiguous_chunks(paths: Sequence[str], count: int, separate: set[str]) -> list[list[str]]:
    if count < 1:
        raise ValueError(f"group_by as an int must be at least 1, got {count}.")
    ordinary = [path for path in paths if path not in separate]
    size = max(1, math.ceil(len(ordinary) / max(1, count - len(separate & set(paths)))))
    groups: list[list[str]] = []
    current: list[str] = []
    for path in paths:
        if path in separate:
            if current:
                groups.append(current)
                current = []
            groups.append([path])
            continue
        current.append(path)
        if len(current) >= size:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


def make_groups(
    grouped_paths: Sequence[Sequence[str]], allowed: Mapping[str, Sequence[str]]
) -> list[Group]:
    """Builds `Group`s whose choices are the union of their members' allowed dtypes."""
    groups = []
    for members in grouped_paths:
        union = [dtype for dtype in PLAN_DTYPES if any(dtype in allowed[p] for p in members)]
        name = f"dtype:{members[0]}" + (f"+{len(members) - 1}" if len(members) > 1 else "")
        groups.append(Group(name=name, paths=tuple(members), choices=tuple(union)))
    return groups


def float16_unsafe_layers(
    profile: Profile | None, model: keras.Model | None = None
) -> dict[str, str]:
    """Returns `{path: reason}` for the layers a profile says cannot run in float16; with the
    model, also those an overflow reaches (overflowing attention logits, values above its max)."""
    if profile is None:
        return {}
    unsafe = {
        path: f"profile: {layer.float16_unsafe_reason}"
        for path, layer in profile.layers.items()
        if not layer.float16_safe
    }
    if model is None:
        return unsafe
    reached = {**_attention_logit_layers(profile, model), **overflow_receivers(profile, model)}
    return {**reached, **unsafe}


#: The sub-layers of an attention its logits need in float32: the key projection (Keras
#: computes q.k in the wider operand's dtype) and the softmax that reads the logits.
ATTENTION_LOGIT_LAYERS = ("_key_dense", "_softmax")


def _attention_logit_layers(profile: Profile, model: keras.Model) -> dict[str, str]:
    """`{path: reason}` of the key projection and softmax of each attention whose logits overflow."""
    paths = layer_paths(model)
    path_of = {id(layer): path for path, layer in paths.items()}
    found = {}
    for path, layer_profile in profile.layers.items():
        logits = layer_profile.internals.get(ATTENTION_LOGITS)
        if path not in paths or logits is None or logits.fits(FLOAT16):
            continue
        for name in ATTENTION_LOGIT_LAYERS:
            child = path_of.get(id(getattr(paths[path], name, None)))
            if child is not None:
                found[child] = (
                    f"profile: the attention logits of {path} reach {logits.max_abs:.3g}, above "
                    "float16's max 65504: computed and normalised in float32"
                )
    return found


def overflow_receivers(profile: Profile, model: keras.Model) -> dict[str, str]:
    """Returns `{path: reason}` of the layers reading values above float16's max (followed through
    raw arithmetic and pass-through layers): Keras casts their inputs, so they would read inf."""
    paths = layer_paths(model)
    path_of = {id(layer): path for path, layer in paths.items()}
    found: dict[str, str] = {}
    for path, layer_profile in profile.layers.items():
        output = layer_profile.activation
        if path not in paths or output is None or output.fits(FLOAT16, tolerance=1.0):
            continue
        largest = math.inf if output.nonfinite else output.max_abs
        for receiver, bound in _receivers(paths[path], largest, path_of):
            if numerics.exceeds_max(bound, FLOAT16) and receiver not in found:
                found[receiver] = (
                    f"profile: receives values up to {bound:.3g} from {path}, above float16's "
                    "max 65504"
                )
    return found


_SCALING_OPERATIONS = {"Multiply": 1, "Divide": -1, "TrueDivide": -1}


def _receivers(operation: object, bound: float, path_of: dict, depth: int = 0):
    """Yields `(path, magnitude bound)` of the layers reading `operation`'s output in the graph."""
    for node in getattr(operation, "_outbound_nodes", ()):
        consumer = node.operation
        power = _SCALING_OPERATIONS.get(type(consumer).__name__, 0)
        numbers = [abs(arg) for arg in node.arguments.args if isinstance(arg, (int, float))]
        scaled = bound * math.prod(number**power for number in numbers if number)
        if id(consumer) in path_of and not is_pass_through(consumer):
            yield path_of[id(consumer)], bound
        elif depth < 32:
            yield from _receivers(consumer, scaled, path_of, depth + 1)


def float8_unsafe_layers(profile: Profile | None) -> dict[str, str]:
    """Returns `{path: reason}` for the layers a profile says cannot train in float8."""
    reasons = getattr(profile, "float8_unsafe_reasons", None) or {}
    return {path: f"profile: {reason}" for path, reason in dict(reasons).items()}


#: Why an output layer gets no float8 in the search space or the heuristic.
OUTPUT_FLOAT8_REASON = (
    "output layer: float8 rounding (3 mantissa bits in E4M3) would reach the predictions "
    "and the loss directly"
)


def run_profiler(
    model: keras.Model, data: tuple, steps: int, batch_size: int = 32, float8_ranges: bool = False
) -> Profile | None:
    """Profiles the model with `autoprec.profile`, or returns `None` with a logged warning."""
    try:
        return profile(
            model, data, steps=steps, batch_size=batch_size, verbose=0, float8_ranges=float8_ranges
        )
    except Exception as error:  # noqa: BLE001 - a failed profile must not stop the search
        logger.warning(
            "autoprec.search: profiling failed (%s: %s); level-1 profile feasibility skipped.",
            type(error).__name__,
            error,
        )
        return None


def allowed_dtypes(
    compute: Sequence[str],
    infos: Mapping[str, LayerInfo],
    dtypes: Sequence[str],
    unsafe: Mapping[str, str],
    keep_float32: Sequence[str],
    float8_unsafe: Mapping[str, str] | None = None,
    outputs: Iterable[str] = (),
) -> tuple[dict[str, tuple[str, ...]], dict[str, dict[str, str]]]:
    """Returns `({path: allowed dtypes}, {path: {dtype: why removed}})` for the compute layers."""
    dtypes = [canonical_dtype(dtype) for dtype in dtypes]
    float8_unsafe = float8_unsafe or {}
    outputs = set(outputs)
    allowed: dict[str, tuple[str, ...]] = {}
    removed: dict[str, dict[str, str]] = {}
    for path in compute:
        reasons: dict[str, str] = {}
        eligible = float8_eligible(infos[path].class_name)
        if matches_any(path, infos[path], keep_float32):
            reasons.update(
                {
                    dtype: "keep_float32"
                    for dtype in dtypes
                    if dtype != FLOAT32 and (dtype != FLOAT8 or eligible)
                }
            )
        else:
            if path in unsafe and FLOAT16 in dtypes:
                reasons[FLOAT16] = unsafe[path]
            if FLOAT8 in dtypes and eligible:
                if path in outputs:
                    reasons[FLOAT8] = OUTPUT_FLOAT8_REASON
                elif path in float8_unsafe:
                    reasons[FLOAT8] = float8_unsafe[path]
        allowed[path] = tuple(
            dtype
            for dtype in PLAN_DTYPES
            if dtype in dtypes and dtype not in reasons and (dtype != FLOAT8 or eligible)
        ) or (FLOAT32,)
        if FLOAT32 not in allowed[path]:
            allowed[path] = (FLOAT32, *allowed[path])
        if reasons:
            removed[path] = reasons
    return allowed, removed


def default_dtypes(
    dtypes: Sequence[str] | None, hardware_profile: HardwareProfile | None, table: CostTable | None
) -> tuple[str, ...]:
    """Returns the dtypes the search may use (level 1, hardware part); logs what it drops."""
    if dtypes is not None:
        chosen = {canonical_dtype(dtype) for dtype in dtypes} | {FLOAT32}
        if hardware_profile is not None:
            for dtype in sorted(chosen - {FLOAT32}):
                if not hardware_profile.is_fast(dtype):
                    logger.info(
                        "autoprec.search: %s is not fast on %s but was asked for in dtypes=; "
                        "kept (the cost model will weigh it).",
                        dtype,
                        hardware_profile.name,
                    )
        return tuple(dtype for dtype in PLAN_DTYPES if dtype in chosen)
    if hardware_profile is None:
        return (FLOAT32, BFLOAT16)
    chosen = [FLOAT32]
    for dtype in (BFLOAT16, FLOAT16, FLOAT8):
        if dtype == FLOAT8 and not hardware_profile.is_fast(FLOAT8):
            continue  # no FP8 tensor cores: float8 is emulated, never a gain (not logged)
        if not hardware_profile.is_fast(dtype):
            logger.info(
                "autoprec.search: %s left out: not fast on %s (pass dtypes=[...] to force it).",
                dtype,
                hardware_profile.name or "this device",
            )
            continue
        if table is not None and not _pays_off(table, dtype):
            where = (
                f"predicted for {hardware_profile.name}"
                if str(getattr(table, "source", "")).startswith("predicted")
                else "measured on this device"
            )
            logger.info(
                "autoprec.search: %s left out: %s no faster than float32 for any layer of "
                "this model (pass dtypes=[...] to force it).",
                dtype,
                where,
            )
            continue
        chosen.append(dtype)
    return tuple(chosen)


def _pays_off(table: CostTable, dtype: str) -> bool:
    """Whether `dtype` is measurably faster than float32 for at least one layer of the table."""
    for path in table.layers:
        try:
            half, full = table.seconds(path, dtype), table.seconds(path, FLOAT32)
        except Exception:  # noqa: BLE001 - a dtype the table did not time
            if dtype == FLOAT8:
                continue  # float8 is timed only for the layers that have it
            return True
        if half < 0.95 * full:
            return True
    return False


def with_container_dtypes(
    infos: Mapping[str, LayerInfo], assignment: Mapping[str, str]
) -> dict[str, str]:
    """Returns `assignment` with each unnamed container given its sub-layers' shared dtype."""
    result = dict(assignment)
    compute = compute_layers(infos)
    for path, info in infos.items():
        if path in result or not info.is_container or info.follows is not None:
            continue
        inside = {
            BFLOAT16 if result.get(child) == FLOAT8 else result.get(child, FLOAT32)
            for child in compute
            if child.startswith(path + "/")
        }
        if len(inside) == 1 and FLOAT32 not in inside:
            result[path] = inside.pop()
    return result


def plan_from_assignment(
    model: keras.Model,
    infos: Mapping[str, LayerInfo],
    assignment: Mapping[str, str],
    default: str = FLOAT32,
    **kwargs: object,
) -> PrecisionPlan:
    """Returns the plan giving each path of `assignment` its dtype (`default` elsewhere)."""
    return PrecisionPlan(
        with_container_dtypes(infos, assignment),
        default=default,
        layer_info=infos,
        fingerprint=model_fingerprint(dict(infos)),
        model_name=model.name,
        **kwargs,
    )


def with_loss_scale_start(plan: PrecisionPlan, profile: Profile | None) -> PrecisionPlan:
    """Returns `plan` with `metadata["loss_scale"]["initial"]`: the largest loss scale its float16
    layers' profiled gradients fit (`Profile.loss_scale_for`), where it runs layers in float16."""
    if profile is None or not plan.uses_float16:
        return plan
    scale = profile.loss_scale_for(
        path for path, dtype in plan.resolve().items() if dtype == FLOAT16
    )
    if scale is None:
        return plan
    return plan.with_metadata(
        loss_scale={**(plan.metadata.get("loss_scale") or {}), "initial": scale}
    )


class PlanCosts:
    """Predicted step time and activation memory of plans, from a cost table or (missing) nothing."""

    def __init__(self, model: keras.Model, table: CostTable | None, batch_size: int) -> None:
        self.model = model
        self.table = table
        self.batch_size = batch_size
        self._cache: dict[tuple, tuple[float, float]] = {}

    @property
    def available(self) -> bool:
        return self.table is not None

    @property
    def relative_error(self) -> float | None:
        """The table's whole-step prediction error (`CostTable.relative_error`), `None` without one."""
        if self.table is None:
            return None
        return float(self.table.relative_error)

    def layer_seconds(self, path: str, dtype: str) -> float | None:
        if self.table is None or path not in self.table.layers:
            return None
        try:
            return float(self.table.seconds(path, dtype, self.batch_size))
        except Exception:  # noqa: BLE001 - a dtype the table did not time
            return None

    def step(self, dtypes: Mapping[str, str]) -> tuple[float, float]:
        """Returns `(predicted step seconds, activation bytes per sample)` for `{path: dtype}`."""
        key = tuple(sorted(dtypes.items()))
        if key not in self._cache:
            # The whole plan, containers included: a container's own arithmetic (attention
            # scores, residual adds) costs time too, in the dtype its sub-layers give it.
            self._cache[key] = (
                self._parameter_proxy(dtypes)
                if self.table is None
                else self._estimate(plan_from_assignment(self.model, self._infos, dtypes))
            )
        return self._cache[key]

    def uniform_seconds(self, dtype: str) -> float:
        """Returns the predicted step seconds of Keras' policy `PrecisionPlan.uniform(model, dtype)`."""
        key = ("uniform", dtype)
        if key not in self._cache:
            self._cache[key] = self._estimate(PrecisionPlan.uniform(self.model, dtype))
        return self._cache[key][0]

    def _estimate(self, plan: PrecisionPlan) -> tuple[float, float]:
        step = estimate(self.model, plan, costs=self.table, batch_size=self.batch_size)
        return float(step.step_seconds), float(step.activation_bytes_per_sample)

    @functools.cached_property
    def _infos(self) -> dict[str, LayerInfo]:
        return describe_model(self.model)

    def _parameter_proxy(self, dtypes: Mapping[str, str]) -> tuple[float, float]:
        infos = self._infos
        factor = {FLOAT32: 1.0, BFLOAT16: 0.5, FLOAT16: 0.5, FLOAT8: 0.25}
        total = sum(
            (infos[path].parameters + 1) * factor[dtype]
            for path, dtype in dtypes.items()
            if path in infos
        )
        return total * 1e-9, total
