"""The automatic mode's decision: `AutoPlan`, fit's first batch, the heuristic plan and its report."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import keras

from .. import cost
from .._core.data import input_part
from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32, count_dtypes, counts_text
from .._core.models import ConfigValue, rebuild_train_function, strategy_scope, swap_attribute
from ..cost import Estimate
from ..errors import PlanError
from ..hardware import HardwareProfile, is_local, resolve_hardware
from ..plan import PrecisionPlan
from ..profiler import Profile
from ..search import Budget, heuristic_plan

logger = logging.getLogger("autoprec")

#: The share of the whole fit the decision may take by default (`AutoPlan.decision_seconds`).
DECISION_SHARE = 0.05

#: The most seconds the decision may take by default, however long the fit.
DECISION_CAP_SECONDS = 60.0

#: The share of the predicted gain over the steps left in the fit that the race's traces may cost.
PAYBACK_SHARE = 0.5


def decision_budget(auto: AutoPlan, fit_seconds: float | None) -> float:
    """Returns the seconds the decision may take: `auto.decision_seconds`, else the default."""
    if auto.decision_seconds is not None:
        return float(auto.decision_seconds)
    if fit_seconds is None:
        return DECISION_CAP_SECONDS
    return min(DECISION_CAP_SECONDS, DECISION_SHARE * float(fit_seconds))


def race_budget(
    auto: AutoPlan,
    step_seconds: float | None,
    speedup: float | None,
    steps_left: int | None,
    left_over: float,
    rated_only: bool = False,
) -> tuple[float, str]:
    """Returns the seconds the race's traces may cost (`PAYBACK_SHARE` of the gain), and why; at
    least what the decision budget leaves where the gain comes from a CPU's rated peaks
    (`rated_only`: a capability, not a speed, so only the race measures it)."""
    left = max(left_over, 0.0), "what the decision budget leaves"
    if auto.decision_seconds is not None or not (step_seconds and speedup and steps_left):
        return left
    gain = step_seconds * max(1.0 - 1.0 / speedup, 0.0)
    why = (
        f"{PAYBACK_SHARE:g} of the predicted {speedup:.2f}x gain, {1e3 * gain:.1f} ms a step "
        f"over {steps_left} steps left"
    )
    if rated_only and left[0] > PAYBACK_SHARE * gain * steps_left:
        return left[0], f"{left[1]}, more than {why}: a gain from a CPU's rated peaks is untested"
    return PAYBACK_SHARE * gain * steps_left, why


def best_predicted_speedup(plan: PrecisionPlan) -> float | None:
    """Returns the best speedup over float32 predicted for the per-layer plan or a uniform policy."""
    speedups = [plan.metadata.get("predicted_speedup") or 0.0]
    start = plan.metadata.get("start")
    steps = (start.get("predicted_step_ms") or {}) if isinstance(start, Mapping) else {}
    if steps.get(FLOAT32) and min(steps.values()) > 0:
        speedups.append(steps[FLOAT32] / min(steps.values()))
    return max(speedups) or None


@dataclasses.dataclass(frozen=True)
class AutoPlan(ConfigValue):
    """Settings of `AutoPrecision()`'s automatic mode: how it profiles, times and decides a plan.

    With no plan, `AutoPrecision` profiles the first `profile_steps` steps of
    `fit` in the model's own policies, times every layer at the batch size `fit`
    uses (read from the first batch) and builds the heuristic plan; with a
    `budget` it runs a short Optuna search of `n_trials` trials on `x` and
    `validation_data` instead (a callback cannot see `fit`'s data, so the
    search needs its own). `get_config()` and `AutoPlan.from_config(config)`
    round-trip it through a plain dict (the data and budget included as they are).

    Attributes:
        profile_steps: steps profiled before deciding.
        batch_size: the batch size layer costs are timed or predicted for;
            `None` reads it from `fit`'s first batch (per replica).
        budget: an `autoprec.Budget`: search under it instead of the heuristic.
        x: training batches for the search: an `(x, y)` tuple of arrays, a
            `tf.data.Dataset`, a `PyDataset` or a generator of batches.
        validation_data: held-out batches the search judges candidate plans on.
        n_trials: trials of that search.
        timing_rounds: where costs are measured here and no budget is given,
            the interleaved rounds of 2 timed steps (more, up to 9, while
            undecided) in which `fit` races the whole train step of float32, each
            uniform 16-bit policy the device runs fast and the per-layer plan; the
            fastest is kept, a tie inside the noise going to the simpler plan
            (`plan.metadata["measured"]`). 0 keeps the predicted plan untimed.
        decision_seconds: the most seconds the decision may add to `fit` where
            costs are measured here; `None`: `DECISION_SHARE` of the whole fit, at
            most `DECISION_CAP_SECONDS` (`decision_budget`), the race's traces paid
            from `PAYBACK_SHARE` of the predicted gain (`race_budget`).
        remember: store the plan a fit ends with (under
            `autoprec.cost.default_cache_dir() / "decisions"`; deleting it forgets
            them) and recall it on the next run of the same model, device and
            settings, nothing profiled or timed, its step time checked once
            (`plan.metadata["measured"]["recalled"]`); `False` neither reads nor writes.

    Raises:
        PlanError: for a `budget` without `x` and `validation_data` (or data
            without a budget), a `budget` that is not an `autoprec.Budget`, or a
            count below 1.

    Example:

    ```python
    auto = autoprec.AutoPlan(
        budget=autoprec.Budget("val_accuracy", max_drop=0.01),
        x=(x_train, y_train), validation_data=(x_val, y_val), n_trials=10,
    )
    model.fit(x_train, y_train, callbacks=[autoprec.AutoPrecision(auto=auto)])
    ```
    """

    profile_steps: int = 20
    batch_size: int | None = None
    budget: Budget | None = None
    x: Any = dataclasses.field(default=None, compare=False)
    validation_data: Any = dataclasses.field(default=None, compare=False)
    n_trials: int = 20
    timing_rounds: int = 5
    decision_seconds: float | None = None
    remember: bool = True

    def __post_init__(self) -> None:
        for name in ("profile_steps", "n_trials"):
            _require_count(name, getattr(self, name))
        if not isinstance(self.remember, bool):
            raise PlanError(f"AutoPlan: remember must be True or False, got {self.remember!r}.")
        if self.timing_rounds != 0:
            _require_count("timing_rounds", self.timing_rounds, "or 0 (no timing)")
        if self.decision_seconds is not None and (
            isinstance(self.decision_seconds, bool)
            or not isinstance(self.decision_seconds, (int, float))
            or not self.decision_seconds >= 0
        ):
            raise PlanError(
                f"AutoPlan: decision_seconds must be a number of seconds >= 0 or None (a share "
                f"of the whole fit), got {self.decision_seconds!r}."
            )
        if self.batch_size is not None:
            _require_count("batch_size", self.batch_size, "or None (the batch size fit uses)")
        if self.budget is not None and not isinstance(self.budget, Budget):
            raise PlanError(
                f"AutoPlan: budget must be an autoprec.Budget or None, got {self.budget!r}; "
                'e.g. budget=autoprec.Budget("val_loss", max_relative_drop=0.02).'
            )
        if self.budget is not None and (self.x is None or self.validation_data is None):
            raise PlanError(
                "AutoPlan: budget= runs a search, which needs x= (training batches) and "
                "validation_data= (held-out batches to judge candidate plans on); a callback "
                "cannot see fit's data. Pass both, or leave budget=None for the heuristic plan."
            )
        if self.budget is None and (self.x is not None or self.validation_data is not None):
            raise PlanError(
                "AutoPlan: x= and validation_data= are the search's data; pass budget= "
                "(an autoprec.Budget) to search, or leave them out for the heuristic plan."
            )

    def __repr__(self) -> str:
        data = ("x", "validation_data")  # shown by their shapes, and only with a budget
        shown = [
            f"{name}={_describe_data(value) if name in data else repr(value)}"
            for name, value in self.get_config().items()
            if name not in data or self.budget is not None
        ]
        return f"AutoPlan({', '.join(shown)})"


def _require_count(name: str, value: object, otherwise: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        accepted = f"an integer >= 1 {otherwise}".strip()
        raise PlanError(f"AutoPlan: {name} must be {accepted}, got {value!r}.")


def _describe_data(data: Any) -> str:
    """Returns a data argument's shapes, not values, for reprs."""
    if isinstance(data, (tuple, list)):
        return "(" + ", ".join(_describe_data(item) for item in data) + ")"
    shape = getattr(data, "shape", None)
    if shape is not None:
        return f"{type(data).__name__}{tuple(shape)}"
    return f"<{type(data).__name__}>"


#: The shortest decision budget costs are timed here within (whole steps first take seconds):
#: below it, costs are predicted for the device and the race inside `fit` measures.
MIN_CALIBRATION_SECONDS = 15.0

#: The batch size costs are timed at when `fit` ran no step to read it from.
FALLBACK_BATCH_SIZE = 32

#: Layers of one class the one-liner times; the others of the class are predicted from them.
LAYERS_PER_KIND = 2


def decide_plan(
    model: keras.Model,
    profile: Profile | None,
    hardware: HardwareProfile | str | None = "local",
    batch_size: int = FALLBACK_BATCH_SIZE,
    verbose: int = 0,
    sample: Any = None,
    time_budget: float | None = None,
    trace_seconds: float = 0.0,
) -> tuple[PrecisionPlan, Estimate | None]:
    """Returns the heuristic plan for `model` and the estimate behind it."""
    hardware_profile = resolve_hardware(hardware)
    allowed = [FLOAT32] + [
        dtype for dtype in (BFLOAT16, FLOAT16, FLOAT8) if hardware_profile.is_fast(dtype)
    ]
    costs = None
    traces = (len(allowed) + 2) * trace_seconds  # calibrate's whole uniform and mixed steps
    too_short = time_budget is not None and time_budget < MIN_CALIBRATION_SECONDS + traces
    if is_local(hardware) and too_short:
        logger.info(
            "autoprec: a %.1f s decision budget is too short to time costs here (%.1f s of "
            "it would trace whole steps); costs are predicted for %s and the whole steps "
            "timed inside fit decide",
            time_budget,
            traces,
            hardware_profile.name,
        )
    try:
        if is_local(hardware) and not too_short:
            if sample is None:
                sample = cost.sample_inputs(model, batch_size)
            costs = cost.calibrate(
                model,
                sample,
                dtypes=allowed,
                verbose=int(verbose >= 1),
                hardware=hardware_profile,
                time_budget=time_budget,
                layers_per_kind=LAYERS_PER_KIND,
            )
        else:
            costs = cost.predict_costs(model, hardware_profile, batch_size=batch_size, x=sample)
    except Exception as error:  # costs improve the plan; their absence must not stop training
        logger.warning("autoprec: cost model unavailable (%s); deciding from parameters", error)
    plan = heuristic_plan(
        model, profile=profile, costs=costs, hardware=hardware_profile, dtypes=allowed
    )
    estimate = None
    if costs is not None:
        try:
            estimate = cost.estimate(model, plan, costs=costs, batch_size=batch_size)
        except Exception as error:
            logger.warning("autoprec: no estimate for the plan (%s)", error)
    plan = plan.with_metadata(
        hardware=hardware_profile.name,
        predicted_speedup=estimate.speedup if estimate is not None else None,
    )
    return plan, estimate


def report_lines(
    plan: PrecisionPlan, estimate: Estimate | None, dtypes: Mapping[str, str]
) -> list[str]:
    """Returns the compact report printed once when the automatic plan is applied."""
    speedup = estimate.speedup if estimate is not None else None
    predicted = f"; predicted speedup {speedup:.2f}x over float32" if speedup else ""
    lines = [
        f"autoprec: automatic plan: {counts_text(count_dtypes(dtypes.values()))} layer(s)"
        f"{predicted} on {plan.metadata.get('hardware')}"
    ]
    start = plan.metadata.get("start")
    if isinstance(start, Mapping) and start.get("policy"):
        steps = start.get("predicted_step_ms") or {}
        figures = ", ".join(f"{dtype} {ms:.3f} ms" for dtype, ms in steps.items())
        why = f"predicted fastest ({figures}; {start.get('costs')})" if figures else "no cost table"
        lines.append(f"  start: uniform {start['policy']}, {why}")
    departures = _departures(plan, dtypes)
    for path, (dtype, reason) in list(departures.items())[:8]:
        lines.append(f"  {dtype} {path}: {reason}")
    if len(departures) > 8:
        lines.append(f"  ... and {len(departures) - 8} more; see plan.metadata['evidence']")
    return lines


def _departures(plan: PrecisionPlan, dtypes: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """`{path: (dtype, reason)}`: the heuristic's departures, or the search's float32 layers."""
    found = {}
    for path, entry in (plan.metadata.get("evidence") or {}).items():
        if not isinstance(entry, Mapping):
            continue
        dtype = dtypes.get(path, "float32")
        if entry.get("kind") is not None:
            if dtype == entry.get("dtype") or entry.get("dtype") is None:
                found[path] = (dtype, f"{entry['kind']}: {entry.get('reason', '')}")
        elif dtype == "float32":
            found[path] = (dtype, _float32_reason(entry))
    return found


def _float32_reason(entry: Mapping[str, Any]) -> str:
    """Returns why a layer stayed float32, from the heuristic's or the search's evidence."""
    if entry.get("reason"):
        return str(entry["reason"])
    removed = entry.get("removed") or {}
    if removed:
        return "; ".join(f"{dtype} ruled out: {why}" for dtype, why in removed.items())
    if entry.get("profile"):
        return f"float16 unsafe: {entry['profile']}"
    return "16-bit did not pay or did not hold the budget in the search"


#: Input dimensions besides the batch that a traced TensorFlow step leaves unknown
#: (a padded sequence length) and `FirstBatchSize` records when the step runs.
RECORDED_DIMENSIONS = 63


class FirstBatchSize:
    """Reads the size of the first batch a model trains on, from inside its train step."""

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        self._static: int | None = None
        self._variable: keras.Variable | None = None
        self._inputs: Any = None  # the first batch's input specs; False: unreadable
        self._dimensions: keras.Variable | None = None
        self._undo: Callable[[], None] | None = None

    def install(self) -> None:
        """Wraps the train step and rebuilds the train function so the next step records."""
        if keras.backend.backend() == "tensorflow":
            with strategy_scope(self.model):
                self._variable = keras.Variable(
                    0,
                    dtype="int32",
                    trainable=False,
                    aggregation="only_first_replica",
                    name="autoprec_first_batch_size",
                )
                self._dimensions = keras.Variable(
                    keras.ops.zeros((RECORDED_DIMENSIONS + 1,), "int32"),
                    dtype="int32",
                    trainable=False,
                    aggregation="only_first_replica",
                    name="autoprec_first_batch_dimensions",
                )
        original = self.model.train_step
        reader = self

        def train_step(*args):
            reader._observe(args[-1])
            return original(*args)

        self._undo = swap_attribute(self.model, "train_step", train_step)
        rebuild_train_function(self.model)

    def remove(self) -> None:
        """Puts the model's own train step back; the train function must be rebuilt after."""
        if self._undo is not None:
            self._undo()
            self._undo = None

    def read(self) -> int | None:
        """Returns the first batch's size, or `None` when no step has run yet."""
        if self._static is None and self._variable is not None:
            return int(keras.ops.convert_to_numpy(self._variable.value)) or None
        return self._static

    def signature(self) -> list | None:
        """Returns the first batch's inputs as JSON-ready `[shape, dtype]` pairs, or `None`."""
        if not self._inputs:
            return None
        size = self.read()
        return [
            [[size, *spec.shape[1:]], str(spec.dtype)] for spec in keras.tree.flatten(self._inputs)
        ]

    def read_inputs(self, batch_size: int | None = None) -> Any:
        """Returns random inputs shaped as the first batch's (structure, dtypes, dimensions)."""
        size = batch_size or self.read()
        if not self._inputs or size is None:
            return None
        specs = self._inputs
        if self._dimensions is not None:
            recorded = [int(v) for v in keras.ops.convert_to_numpy(self._dimensions.value)]
            if recorded[0]:
                specs = _with_dimensions(specs, iter(recorded[1:]))
        try:
            return cost.random_inputs(specs, size)
        except PlanError as error:
            logger.info("autoprec: the first batch's shapes are unknown (%s)", error)
            return None

    def _write_dimensions(self, inputs: Any) -> None:
        """Has the traced step write, once, the dimensions the recorded specs leave unknown."""
        specs, arrays = keras.tree.flatten(self._inputs), keras.tree.flatten(inputs)
        if self._dimensions is None or len(specs) != len(arrays):
            return
        unknown = [
            keras.ops.shape(array)[axis]
            for spec, array in zip(specs, arrays)
            for axis, dim in enumerate(spec.shape)
            if axis > 0 and dim is None
        ][:RECORDED_DIMENSIONS]
        if unknown:
            written = keras.ops.stack([keras.ops.cast(dim, "int32") for dim in [1, *unknown]])
            written = keras.ops.pad(written, [[0, RECORDED_DIMENSIONS - len(unknown)]])
            current = self._dimensions.value
            first = keras.ops.equal(current[0], 0)
            self._dimensions.assign(keras.ops.where(first, written, current))

    def _observe(self, data: Any) -> None:
        arrays = [
            value for value in keras.tree.flatten(data) if len(getattr(value, "shape", ())) > 0
        ]
        if not arrays:
            return
        try:
            # Every trace of the step writes the dimensions the first one left unknown.
            if self._inputs is None:
                self._inputs = keras.tree.map_structure(cost.spec_of, input_part(data))
            if self._inputs is not False:
                self._write_dimensions(input_part(data))
        except Exception as error:  # noqa: BLE001 - reading shapes must never stop training
            logger.info("autoprec: the first batch's shapes could not be read (%s)", error)
            self._inputs = False
        size = arrays[0].shape[0]
        if isinstance(size, int):
            if self._static is None:
                self._static = size
        elif self._variable is not None:
            size = keras.ops.cast(keras.ops.shape(arrays[0])[0], "int32")
            current = self._variable.value
            self._variable.assign(keras.ops.where(keras.ops.equal(current, 0), size, current))


def _with_dimensions(specs: Any, dimensions: Iterator[int]) -> Any:
    """Returns `specs` with their unknown dimensions (besides the batch) taken from `dimensions`."""

    def filled(spec: cost.TensorSpec) -> cost.TensorSpec:
        rest = [(next(dimensions, 0) or None) if dim is None else dim for dim in spec.shape[1:]]
        return cost.TensorSpec((*spec.shape[:1], *rest), spec.dtype)

    return keras.tree.map_structure(filled, specs)
