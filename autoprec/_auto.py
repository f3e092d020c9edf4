"""The decision behind `AutoPrecision()` with no plan: profile + local costs -> heuristic plan.

- `AutoPlan`: the settings of that automatic mode (profiling, batch size, the optional search).
- `FirstBatchSize`: reads the batch size `fit` trains with from inside the train step.
- `decide_plan`: the heuristic plan from the profile and the costs at that batch size.
- `search_plan`: the short Optuna search run instead of the heuristic when a budget is given.
- `race_candidates` / `race_lines`: the plans whose whole train step is timed inside `fit`
  before one is kept, and the report of that timing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import keras

from . import cost
from ._core.config import ConfigValue
from ._core.data import input_part
from ._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32, count_dtypes, counts_text
from ._core.models import rebuild_train_function, strategy_scope, swap_attribute
from .cost import CostTable, Estimate
from .errors import PlanError
from .hardware import HardwareProfile, is_local, resolve_hardware
from .plan import PrecisionPlan
from .profiler import Profile
from .runtime.step_race import RaceResult
from .search import (
    Budget,
    SearchResult,
    SearchSettings,
    compute_layers,
    float8_unsafe_layers,
    float16_unsafe_layers,
    heuristic_plan,
    is_sensitive,
    output_layers,
    search,
)

logger = logging.getLogger("autoprec")

#: The batch size costs are timed at when `fit` ran no step to read it from.
FALLBACK_BATCH_SIZE = 32

#: Input dimensions besides the batch that a traced TensorFlow step leaves unknown
#: (a padded sequence length) and `FirstBatchSize` records when the step runs.
RECORDED_DIMENSIONS = 63


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
        timing_rounds: where costs are measured here (`hardware="local"`) and no
            budget is given, the heuristic plan is not kept on its prediction: the
            next steps of `fit` run float32, each uniform 16-bit policy the device
            runs fast and the profile allows (as Keras' global `mixed_*` policy sets
            it: every layer) and the per-layer plan in turn, each traced once, then
            in `timing_rounds` interleaved rounds of 2 timed steps each (more rounds,
            up to 9, while the verdict is undecided; all inside the first epoch,
            judged on the rounds timed when it ends); the fastest whole step is
            kept, a difference inside the measured noise going to the simpler plan
            (`plan.metadata["measured"]` records what was timed). These steps train
            the model as usual. 0 keeps the predicted plan without timing.

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

    def __post_init__(self) -> None:
        for name in ("profile_steps", "n_trials"):
            _require_count(name, getattr(self, name))
        if self.timing_rounds != 0:
            _require_count("timing_rounds", self.timing_rounds, "or 0 (no timing)")
        if self.batch_size is not None:
            _require_count("batch_size", self.batch_size, "or None (the batch size fit uses)")
        if self.budget is not None and not isinstance(self.budget, Budget):
            raise PlanError(
                f"AutoPlan: budget must be an autoprec.Budget or None, got {self.budget!r}; "
                'e.g. budget=autoprec.Budget("val_loss", max_relative_drop=0.02).'
            )
        has_data = self.x is not None and self.validation_data is not None
        if self.budget is not None and not has_data:
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
        data = ""
        if self.budget is not None:
            data = f", x={_describe_data(self.x)}, validation_data={_describe_data(self.validation_data)}"
        return (
            f"AutoPlan(profile_steps={self.profile_steps}, batch_size={self.batch_size}, "
            f"budget={self.budget!r}{data}, n_trials={self.n_trials}, "
            f"timing_rounds={self.timing_rounds})"
        )


def _require_count(name: str, value: object, otherwise: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        accepted = f"an integer >= 1 {otherwise}".strip()
        raise PlanError(f"AutoPlan: {name} must be {accepted}, got {value!r}.")


def _describe_data(data: Any) -> str:
    """Returns a short description of a data argument (shapes, not values) for reprs."""
    if isinstance(data, (tuple, list)):
        return "(" + ", ".join(_describe_data(item) for item in data) + ")"
    shape = getattr(data, "shape", None)
    if shape is not None:
        return f"{type(data).__name__}{tuple(shape)}"
    return f"<{type(data).__name__}>"


class FirstBatchSize:
    """Reads the size of the first batch a model trains on, from inside its train step.

    `install()` wraps the model's `train_step` (on the instance) and rebuilds the
    train function; the wrapper records the leading dimension of the batch's
    first array the first time it runs. Where the shape is known when the step
    is traced (JAX, torch, a dataset batched with `drop_remainder=True`) it is
    read then; where it is not (TensorFlow, whose datasets have an unknown batch
    dimension) the traced step writes it into a variable, once, so the last
    partial batch of an epoch never replaces it. Under a `tf.distribute`
    strategy it is the batch of one replica. The inputs' structure, dtypes and
    shapes are recorded alike (other dimensions the traced step leaves unknown,
    such as a padded sequence length, are written once when it runs), so that
    `read_inputs()` gives inputs shaped as `fit` feeds them, to time costs at.
    `remove()` unwraps (the caller rebuilds the train function).

    Args:
        model: a compiled Keras model.

    Example:

    ```python
    reader = FirstBatchSize(model)
    reader.install()
    model.fit(x, y, batch_size=64, epochs=1)
    reader.read()  # 64
    reader.read_inputs()["token_ids"].shape  # (64, 32) for a dict of (n, 32) arrays
    reader.remove()
    ```
    """

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
        if self._static is not None:
            return self._static
        if self._variable is not None:
            value = int(keras.ops.convert_to_numpy(self._variable.value))
            return value or None
        return None

    def read_inputs(self, batch_size: int | None = None) -> Any:
        """Returns random inputs shaped as the first batch's (structure, dtypes, dimensions).

        Args:
            batch_size: samples; default the first batch's.

        Returns:
            NumPy arrays nested as the batch's inputs, or `None` when no step has
            run or a dimension could not be recorded.
        """
        size = batch_size or self.read()
        if self._inputs is None or self._inputs is False or size is None:
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


def decide_plan(
    model: keras.Model,
    profile: Profile | None,
    hardware: HardwareProfile | str | None = "local",
    batch_size: int = FALLBACK_BATCH_SIZE,
    calibrate_costs: bool = True,
    verbose: int = 0,
    sample: Any = None,
) -> tuple[PrecisionPlan, Estimate | None]:
    """Returns the heuristic plan for `model` and the estimate behind it.

    Costs are measured on the local device (`hardware="local"`, cached) or
    predicted from a named hardware profile. Layers whose recorded ranges do not
    fit float16 never get float16.

    Args:
        model: the built model being trained.
        profile: an `autoprec.profiler.Profile`, or `None` when none could be recorded.
        hardware: `"local"` (this device) or a hardware profile (name or
            `HardwareProfile`), as `autoprec.hardware.resolve_hardware` accepts.
        batch_size: batch size the costs are measured or predicted for.
        calibrate_costs: measure costs on this device when `hardware` means this device.
        verbose: 1 shows a progress bar while costs are measured, 0 none.
        sample: inputs shaped as the batches `fit` feeds (an array, a list, a dict
            or any nesting of them, `batch_size` samples), whose shapes costs are
            timed or predicted at; `None` builds them from the model's inputs,
            which needs every dimension besides the batch to be known.

    Returns:
        `(plan, estimate)`; `estimate` is `None` if no cost model could be built.

    Example:

    ```python
    plan, estimate = decide_plan(model, prof, hardware="rtx4090", batch_size=64)
    ```
    """
    hardware_profile = resolve_hardware(hardware)
    allowed = [FLOAT32] + [
        dtype for dtype in (BFLOAT16, FLOAT16) if hardware_profile.is_fast(dtype)
    ]
    costs = None
    try:
        if calibrate_costs and is_local(hardware):
            if sample is None:
                sample = cost.sample_inputs(model, batch_size)
            costs = measure_costs(model, sample, allowed, hardware_profile, verbose)
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
        evidence=float32_reasons(model, plan, profile, allowed),
    )
    return plan, estimate


def measure_costs(
    model: keras.Model,
    sample: Any,
    dtypes: Sequence[str],
    hardware: HardwareProfile,
    verbose: int,
) -> CostTable:
    """Returns the layer costs measured on this device for `sample`'s batch size (`cost.calibrate`).

    Args:
        model: the built model.
        sample: a batch of inputs; its size is the batch size timed.
        dtypes: the compute dtypes to time.
        hardware: the detected device's profile, for fallback predictions.
        verbose: 1 shows a `keras.utils.Progbar` while timing, 0 none.

    Returns:
        The measured `CostTable` (cached per device and layer signature).

    Example:

    ```python
    costs = measure_costs(model, autoprec.cost.sample_inputs(model, 64), ["float32"], hw, 0)
    ```
    """
    return cost.calibrate(
        model, sample, dtypes=dtypes, verbose=int(verbose >= 1), hardware=hardware
    )


def search_plan(
    model: keras.Model,
    auto: AutoPlan,
    profile: Profile | None,
    hardware: HardwareProfile | str,
    batch_size: int,
) -> SearchResult:
    """Returns the result of the short search `AutoPlan(budget=...)` asks for.

    Args:
        model: the model being trained (trials run on clones).
        auto: the settings, with `budget`, `x`, `validation_data` and `n_trials`.
        profile: the recorded profile, reused by the search, or `None`.
        hardware: `"local"` or a hardware profile, as `autoprec.search` takes it.
        batch_size: the batch size the trials train and costs are timed at.

    Returns:
        The `autoprec.SearchResult`; its `plan` is the plan to apply.

    Example:

    ```python
    result = search_plan(model, auto, prof, "rtx4090", batch_size=64)
    ```
    """
    return search(
        model,
        auto.x,
        auto.validation_data,
        budget=auto.budget,
        hardware=hardware,
        n_trials=auto.n_trials,
        verbose=0,
        settings=SearchSettings(profile=profile, batch_size=batch_size),
    )


def float32_reasons(
    model: keras.Model, plan: PrecisionPlan, profile: Profile | None, allowed: Sequence[str]
) -> dict[str, dict[str, str]]:
    """Returns `{path: {"reason": ...}}` for each computing layer the plan keeps in float32.

    Args:
        model: the model the plan is for.
        plan: the plan, with `layer_info` (as `heuristic_plan` returns it).
        profile: the recorded profile, or `None`.
        allowed: the dtypes the plan could use on this device.

    Returns:
        One entry per float32 compute layer, saying why it stayed float32.

    Example:

    ```python
    float32_reasons(model, plan, prof, ["float32", "bfloat16"])["head"]["reason"]
    ```
    """
    infos = plan.layer_info
    outputs = output_layers(model, infos)
    unsafe = float16_unsafe_layers(profile) if profile is not None else {}
    reasons: dict[str, dict[str, str]] = {}
    for path in compute_layers(infos):
        if plan.layers.get(path) != FLOAT32:
            continue
        if path in outputs:
            reason = "model output: kept float32 for the loss"
        elif is_sensitive(infos[path]):
            reason = f"{infos[path].class_name} is numerically sensitive (exp/normalisation)"
        elif path in unsafe and BFLOAT16 not in allowed:
            reason = f"float16 unsafe ({unsafe[path]}); bfloat16 not fast on this device"
        elif len(allowed) == 1:
            reason = "no 16-bit dtype runs fast on this device"
        else:
            reason = "16-bit measured no faster than float32 here"
        reasons[path] = {"reason": reason}
    return reasons


def report_lines(
    plan: PrecisionPlan, estimate: Estimate | None, dtypes: Mapping[str, str]
) -> list[str]:
    """Returns the compact report printed once when the automatic plan is applied.

    Args:
        plan: the plan as applied, with `metadata["hardware"]` and `["evidence"]`.
        estimate: the cost estimate behind it, or `None`.
        dtypes: `{path: dtype}` each layer computes in.

    Returns:
        One line of counts and predicted speedup, then a line per float32 layer (at most 8).

    Example:

    ```python
    lines = report_lines(plan, estimate, handle.dtypes)
    ```
    """
    speedup = estimate.speedup if estimate is not None else None
    lines = [
        "autoprec: automatic plan: "
        + counts_text(count_dtypes(dtypes.values()))
        + " layer(s)"
        + (f"; predicted speedup {speedup:.2f}x over float32" if speedup else "")
        + f" on {plan.metadata.get('hardware')}"
    ]
    evidence = {
        path: entry
        for path, entry in (plan.metadata.get("evidence") or {}).items()
        if dtypes.get(path, "float32") == "float32"
    }
    for path, entry in list(evidence.items())[:8]:
        lines.append(f"  float32 {path}: {_float32_reason(entry)}")
    if len(evidence) > 8:
        lines.append(f"  ... and {len(evidence) - 8} more float32 layer(s); see plan.summary()")
    return lines


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


#: The name of the per-layer plan among the plans timed inside `fit`.
PER_LAYER = "per-layer"


def race_candidates(
    model: keras.Model,
    plan: PrecisionPlan,
    profile: Profile | None,
    hardware: HardwareProfile,
) -> dict[str, PrecisionPlan]:
    """Returns the plans whose whole step the one-liner times, simplest first, each once.

    They are float32, each uniform 16-bit policy the device runs fast (float16
    only where the profile says every layer's ranges fit it), set on every layer
    as Keras' global `mixed_*` policy does, on a device with FP8 tensor cores float8
    on every Dense/EinsumDense layer but the output layers and those whose float8
    ranges do not fit (bfloat16 elsewhere), and the per-layer plan. The uniform
    plans keep the output layers in float32 unless the model is trained with a
    classification loss (cross-entropy): a regression output rounded to 16 bits
    puts an error floor on the loss that a few timed steps cannot show. A plan
    that gives the layers the same dtypes as a simpler one is left out.

    Args:
        model: the built model.
        plan: the per-layer plan `decide_plan` returned.
        profile: the recorded profile, or `None`.
        hardware: the device's profile.

    Returns:
        `{name: plan}`: `"float32"`, `"mixed_bfloat16"`, `"mixed_float16"`, `"float8"`,
        `"per-layer"`.

    Example:

    ```python
    candidates = race_candidates(model, plan, prof, resolve_hardware("local"))
    list(candidates)  # ["float32", "mixed_bfloat16", "per-layer"]
    ```
    """
    candidates = {FLOAT32: PrecisionPlan.uniform(model, FLOAT32)}
    outputs = () if has_classification_loss(model) else output_layers(model, plan.layer_info)
    for dtype in (BFLOAT16, FLOAT16):
        if not hardware.is_fast(dtype):
            continue
        if dtype == FLOAT16 and (profile is None or float16_unsafe_layers(profile)):
            continue
        uniform = PrecisionPlan.uniform(model, dtype)
        for path in sorted(outputs):
            uniform = uniform.with_dtype(path, FLOAT32)
        candidates[f"mixed_{dtype}"] = uniform
    if hardware.is_fast(FLOAT8) and hardware.is_fast(BFLOAT16):
        # Float8 wherever Keras allows it, output layers and float8-unsafe layers excepted.
        uniform = PrecisionPlan.uniform(model, FLOAT8)
        refused = {*output_layers(model, plan.layer_info), *float8_unsafe_layers(profile)}
        for path in sorted(refused & set(uniform.layers)):
            if uniform.layers[path] == FLOAT8:
                uniform = uniform.with_dtype(path, BFLOAT16)
        candidates["float8"] = uniform
    candidates[PER_LAYER] = plan
    unique: dict[str, PrecisionPlan] = {}
    seen: list[dict[str, str]] = []
    for name, candidate in candidates.items():
        dtypes = candidate.resolve()
        if dtypes not in seen:
            seen.append(dtypes)
            unique[name] = candidate
    return unique


#: Words in a loss's name that make it a classification loss (outputs may round to 16 bits).
CLASSIFICATION_LOSS_WORDS = ("crossentropy", "hinge")


def has_classification_loss(model: keras.Model) -> bool:
    """Returns whether every loss `model` is compiled with is a classification loss.

    Args:
        model: a compiled model.

    Returns:
        `True` for cross-entropy or hinge losses (strings, `keras.losses` objects or
        functions, for each output); `False` for any other loss, or none.

    Example:

    ```python
    model.compile("adam", "sparse_categorical_crossentropy")
    has_classification_loss(model)  # True
    ```
    """
    losses = [loss for loss in keras.tree.flatten(getattr(model, "loss", None)) if loss is not None]
    if not losses:
        return False

    def name_of(loss: Any) -> str:
        if isinstance(loss, str):
            return loss
        name = getattr(loss, "name", None) or type(loss).__name__
        if type(loss).__name__ in ("function", "LossFunctionWrapper"):
            name = getattr(loss, "__name__", None) or getattr(loss, "name", "")
        return str(name)

    return all(
        any(word in name_of(loss).lower().replace("_", "") for word in CLASSIFICATION_LOSS_WORDS)
        for loss in losses
    )


def race_lines(result: RaceResult, estimate: Estimate | None) -> list[str]:
    """Returns the report of the whole steps timed inside `fit`: what was timed and what it chose.

    Args:
        result: what `StepRace` measured.
        estimate: the per-layer plan's cost estimate, or `None`.

    Returns:
        One or two lines.

    Example:

    ```python
    for line in race_lines(race.result(), estimate):
        print(line)
    ```
    """
    verdict = result.verdict
    names = list(result.rounds)
    timed = (
        f"autoprec: timed the whole train step of {', '.join(names)} inside fit "
        f"({result.rounds_run} interleaved round(s) of 2 steps; {result.steps} steps, "
        f"+{result.added_seconds:.1f} s over the chosen plan's pace)"
    )
    if verdict is None:
        return [
            timed,
            "  the first epoch ended before every plan was timed: keeping the per-layer plan",
        ]
    medians = verdict.medians
    figures = ", ".join(f"{name} {1e3 * medians[name]:.2f} ms" for name in medians)
    predicted = (
        f"; predicted {estimate.speedup:.2f}x"
        if estimate is not None and estimate.speedup and PER_LAYER in medians
        else ""
    )
    leader = verdict.leader
    chosen = f"keeping {leader}"
    if leader != FLOAT32:
        chosen += f" ({medians[FLOAT32] / medians[leader]:.2f}x float32)"
    if verdict.fastest != leader:
        noise = verdict.comparisons[leader].noise
        chosen += (
            f"; {verdict.fastest} was {medians[leader] / medians[verdict.fastest]:.2f}x "
            f"faster, inside the measured noise ({1e3 * noise:.2f} ms)"
        )
    return [timed, f"  median step: {figures}{predicted}; {chosen}"]


def race_winner_plan(
    candidates: Mapping[str, PrecisionPlan], result: RaceResult, per_layer: PrecisionPlan
) -> PrecisionPlan:
    """Returns the plan the timing chose, its measurement recorded in `metadata["measured"]`.

    Args:
        candidates: the plans timed, by name.
        result: what was measured.
        per_layer: the per-layer plan (kept when training ended before a verdict).

    Returns:
        The chosen plan; a uniform one keeps the per-layer plan's `hardware` metadata
        (`metadata["measured"]` says why it was kept).

    Example:

    ```python
    plan = race_winner_plan(candidates, race.result(), plan)
    plan.metadata["measured"]["winner"]
    ```
    """
    name = result.winner or PER_LAYER
    measured = result.to_dict()
    if name == PER_LAYER:
        return per_layer.with_metadata(measured=measured)
    return candidates[name].with_metadata(
        hardware=per_layer.metadata.get("hardware"),
        predicted_speedup=None,
        evidence={},
        measured=measured,
    )
