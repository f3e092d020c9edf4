"""The plans the measured ranking compares beside the searched one, and how simple each is."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence

import optuna

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32, policy_name
from ..layers import LayerInfo, model_fingerprint
from ..plan import PrecisionPlan
from ..profiler import Profile
from .context import SearchContext
from .record import TrialRecord, assignment_key
from .space import SENSITIVE_CLASS_PATTERNS, matches_any
from .study import is_feasible

#: The name of the best plan by predicted cost when it is no warm start.
SEARCHED = "searched"
#: Prefix of the labels of Keras' own global policies (`"keras mixed_bfloat16"`).
KERAS_PREFIX = "keras "
#: Prefix of the uniform warm starts' labels (`"uniform bfloat16"`).
UNIFORM_PREFIX = "uniform "
#: The heuristic's warm start label.
HEURISTIC = "heuristic"
#: Prefix of the labels of plans with one kind of float32 protection dropped.
DROPPED_PREFIX = "no float32 "
#: The kinds of default float32 protections, in the order their candidates are made.
PROTECTION_KINDS = ("softmax", "normalisation", "outputs")


def keras_label(dtype: str) -> str:
    """Returns the label of Keras' global policy for `dtype`: `"keras mixed_bfloat16"`."""
    return f"{KERAS_PREFIX}{policy_name(dtype)}"


def keras_dtype(label: str | None) -> str | None:
    """Returns the dtype of a Keras global label (`"float8"` for `float8_from_mixed_bfloat16`)."""
    for dtype in (BFLOAT16, FLOAT16, FLOAT8):
        if label == keras_label(dtype):
            return dtype
    return None


def plan_default(dtype: str) -> str:
    """The default of a Keras global plan: `dtype`, or bfloat16 (float8's source) for float8."""
    return BFLOAT16 if dtype == FLOAT8 else dtype


def dropped_label(kind: str) -> str:
    """Returns the label of the plan with one protection kind dropped: `"no float32 softmax"`."""
    return f"{DROPPED_PREFIX}{kind}"


def simplicity(name: str) -> int:
    """Returns how simple a finalist is (lower is simpler): ties in the measured ranking go lower."""
    if name == FLOAT32:
        return 0
    if name.startswith((KERAS_PREFIX, UNIFORM_PREFIX)):
        return 1
    if name == HEURISTIC:
        return 2
    if name.startswith(DROPPED_PREFIX):
        return 3
    return 4


def keras_global_plan(
    context: SearchContext, dtype: str, keep_float32: Sequence[str] = ()
) -> PrecisionPlan:
    """Returns Keras' global policy as Keras applies it: every layer in `dtype`, containers too."""
    plan = PrecisionPlan.uniform(context.model, dtype)
    if not keep_float32:
        return plan
    layers = dict(plan.layers)
    for path in layers:
        info = context.infos.get(path)
        if info is not None and matches_any(path, info, keep_float32):
            layers[path] = FLOAT32
    return exact_plan(context, layers, plan_default(dtype))


def exact_plan(context: SearchContext, layers: Mapping[str, str], default: str) -> PrecisionPlan:
    """Returns the plan naming `layers` (containers included) with `default` elsewhere."""
    return PrecisionPlan(
        dict(layers),
        default=default,
        layer_info=context.infos,
        fingerprint=model_fingerprint(dict(context.infos)),
        model_name=context.model.name,
    )


def finalist_plan(context: SearchContext, trial: optuna.trial.FrozenTrial) -> PrecisionPlan:
    """Returns the plan a trial evaluated: a Keras global policy exactly, else its assignment's."""
    record = TrialRecord.from_trial(trial)
    dtype = keras_dtype(record.warm_start)
    if dtype is None or not record.assignment:
        return context.trial_plan(trial)
    return exact_plan(context, record.assignment, plan_default(dtype))


def finalist_key(context: SearchContext, trial: optuna.trial.FrozenTrial) -> str:
    """Returns a key equal for trials that evaluated the same plan (containers counted)."""
    record = TrialRecord.from_trial(trial)
    if keras_dtype(record.warm_start) is not None and record.assignment_key:
        return record.assignment_key
    return assignment_key(context.trial_assignment(trial))


def ranked_finalists(context: SearchContext, study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Returns the completed trials within budget, cheapest first, one per plan."""
    feasible = [
        trial
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if is_feasible(trial) and trial.value is not None
    ]
    ranked, seen = [], set()
    for trial in sorted(feasible, key=lambda t: (t.value, t.number)):
        key = finalist_key(context, trial)
        if key not in seen:
            seen.add(key)
            ranked.append(trial)
    return ranked


def protections(
    compute: Sequence[str], infos: Mapping[str, LayerInfo], outputs: Sequence[str]
) -> dict[str, tuple[str, ...]]:
    """Returns `{kind: compute paths}` of the default float32 protections, one entry per kind."""
    softmax = tuple(pattern for pattern in SENSITIVE_CLASS_PATTERNS if "Softmax" in pattern)
    normalisation = tuple(pattern for pattern in SENSITIVE_CLASS_PATTERNS if pattern not in softmax)

    def of_class(patterns: Sequence[str]) -> tuple[str, ...]:
        return tuple(
            path
            for path in compute
            if any(fnmatch.fnmatchcase(infos[path].class_name, pattern) for pattern in patterns)
        )

    return {
        "softmax": of_class(softmax),
        "normalisation": of_class(normalisation),
        "outputs": tuple(path for path in compute if path in set(outputs)),
    }


def sixteen_bit_dtype(assignment: Mapping[str, str]) -> str | None:
    """Returns the 16-bit dtype most layers of `assignment` take (bfloat16 among equals), or `None`."""
    counts = {
        dtype: sum(value == dtype for value in assignment.values()) for dtype in (BFLOAT16, FLOAT16)
    }
    best = max(counts, key=lambda dtype: (counts[dtype], dtype == BFLOAT16))
    return best if counts[best] else None


def fits_profile(profile: Profile | None, path: str, dtype: str) -> bool:
    """Whether the profile shows a layer's forward values and gradients fit `dtype`."""
    if profile is None:
        return False
    layer, parts = None, path.split("/")
    while parts and layer is None:
        layer = profile.layers.get("/".join(parts))
        parts = parts[:-1]
    if layer is None:
        return False
    return layer.float16_safe if dtype == FLOAT16 else layer.bfloat16_safe


def dropped_protection(
    assignment: Mapping[str, str],
    kinds: Mapping[str, Sequence[str]],
    allowed: Mapping[str, Sequence[str]],
    profile: Profile | None,
) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Returns the plans with one protection kind moved to the plan's 16-bit dtype, and why not."""
    dtype = sixteen_bit_dtype(assignment)
    plans: dict[str, dict[str, str]] = {}
    skipped: dict[str, str] = {}
    for kind, paths in kinds.items():
        label = dropped_label(kind)
        kept = [path for path in paths if assignment.get(path) == FLOAT32]
        if dtype is None:
            skipped[label] = "the plan has no 16-bit layer"
        elif profile is None:
            skipped[label] = "no profile to show the ranges fit"
        elif not kept:
            skipped[label] = f"no {kind} layer kept in float32"
        else:
            moved = [
                path
                for path in kept
                if dtype in allowed.get(path, ()) and fits_profile(profile, path, dtype)
            ]
            if moved:
                plans[label] = {**assignment, **dict.fromkeys(moved, dtype)}
            else:
                skipped[label] = f"the profile does not show the {kind} ranges fit {dtype}"
    return plans, skipped
