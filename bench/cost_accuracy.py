"""How well calibrated per-layer costs predict whole training steps, uniform and mixed.

For each model, measures the real whole-model train step (`train_on_batch`) of
the model built under `float32`, `mixed_bfloat16` and `mixed_float16`, and of
mixed plans, all timed in interleaved rounds (median):

* `half-bf16`, `half-f16`: the first half of the layers with weights in
  bfloat16, or in float16 with loss scaling, the rest float32 (one or two
  dtype boundaries);
* `alt-bf16`: bfloat16 and float32 alternating among the layers with weights
  (`autoprec.cost.mixed_assignment`: many boundaries);
* `heur`: the plan `autoprec.heuristic_plan` makes from the calibrated table
  (the prediction's error as its margin); `heur-0`: the plan it makes from the
  same table with no boundary cost and no margin (what it did before both).

Beside each, the step `autoprec.cost.estimate` predicts from a `calibrate` table:

* `pred`: the default calibration: per-layer timings + casts, corrected by the
  whole uniform steps `calibrate` measures for every dtype it times, plus the
  boundary cost it learns from its own mixed steps;
* `nobnd`: the same table with the boundary cost taken out (the prediction
  before the boundary correction);
* `old`: corrected by the float32 whole step only (a prediction for every
  16-bit policy and plan: nothing 16-bit was timed as a whole).

A uniform policy whose whole step the calibration measured is marked `*`: its
`pred` matches by construction, up to the noise between two measurements of
two copies of the model. `calibrate` times its own alternating and half plans
(the alternating one fits the boundary cost, the half one checks it): `alt-bf16`
and `half-bf16` here are timed again, apart, so their `pred` error is the noise
between two runs plus what the fit misses; `heur` is a plan `calibrate` never
timed. Each model's line gives the table's own `relative_error`, and the closing
lines how many mixed plans' errors it covers. float16 steps take many times
float32's on a CPU, so steps with float16 layers are timed `--float16-repeats`
times (default 1, after one warm-up step), or not at all for the models named in
`--skip-float16-measure`, and no float16 is calibrated outside `--dtypes`.

Prints the ratios to float32, their error and whether the predicted ranking of
the uniform policies is the measured one.

Usage:

```
python bench/cost_accuracy.py              # the four default models
python bench/cost_accuracy.py --quick      # the 4x Dense(2048) MLP and the Transformer, no float16
python bench/cost_accuracy.py --models mobilenetv3small --dtypes float32,bfloat16
python bench/cost_accuracy.py --models mobilenetv2,transformer --image-size 32
python bench/cost_accuracy.py --models densenet121,mlp --dtypes float32,bfloat16
python bench/cost_accuracy.py --skip-float16-measure resnet50,efficientnetb0
```
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from autoprec import PrecisionPlan, apply_plan, cost, heuristic_plan  # noqa: E402
from autoprec.layers import describe_model, layer_paths  # noqa: E402
from autoprec.search.space import plan_from_assignment  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/, for its shared `common`
from common import host  # noqa: E402
from common.models import APPLICATIONS, application, encoder_classifier, mlp  # noqa: E402
from common.timing import interleave  # noqa: E402

POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
#: Mixed plans measured beside the uniform policies: name -> dtype of the first half.
MIXED = {"half-bf16": "bfloat16", "half-f16": "float16"}
#: Mixed plans with many boundaries or chosen by the heuristic: name -> what they are.
PLANNED = {
    "alt-bf16": "bfloat16 and float32 alternating among the layers with weights",
    "heur": "heuristic_plan from the calibrated table",
    "heur-0": "heuristic_plan from that table without boundary cost and margin",
}
#: Every row of the table: uniform policies, then mixed plans.
ROWS = (*POLICIES, *MIXED, *PLANNED)
CLASSES = 10
#: Input height and width of the image models (set by `--image-size`).
IMAGE_SIZE = 32


def build_model(name: str) -> keras.Model:
    """Builds a model under the current global dtype policy (the head float32 under any)."""
    if name == "mlp":  # 4x Dense(2048) on 2048 features
        return mlp(2048, 2048, 4, head_dtype="float32")
    if name == "transformer":  # two blocks on 64 token ids, width 128
        return encoder_classifier(
            length=64, width=128, heads=4, blocks=2, hidden=256, head_dtype="float32"
        )
    if name in APPLICATIONS:
        options = {"include_preprocessing": False} if name == "mobilenetv3small" else {}
        return application(name, IMAGE_SIZE, CLASSES, **options)
    raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS + EXTRA_MODELS)}")


MODELS = ("mobilenetv2", "resnet50", "efficientnetb0", "transformer")
#: Models run only when named in `--models` (or by `--quick`).
EXTRA_MODELS = ("mlp", "mobilenetv3small", "densenet121")


def make_batch(name: str, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    if name == "transformer":
        x = rng.integers(0, 1000, size=(batch_size, 64)).astype("int32")
    elif name == "mlp":
        x = rng.standard_normal((batch_size, 2048)).astype("float32")
    else:
        x = rng.standard_normal((batch_size, IMAGE_SIZE, IMAGE_SIZE, 3)).astype("float32")
    y = rng.integers(0, CLASSES, size=(batch_size,)).astype("int32")
    return x, y


def build_compiled(name: str, policy: str) -> keras.Model:
    """Builds and compiles the model under a global dtype policy, then restores float32."""
    keras.config.set_dtype_policy(policy)
    try:
        model = build_model(name)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    finally:
        keras.config.set_dtype_policy("float32")
    return model


def half_plan(model: keras.Model, dtype: str) -> PrecisionPlan:
    """float32, with the first half of the layers that hold weights in `dtype`."""
    weighted = [path for path, layer in layer_paths(model).items() if layer.weights]
    plan = PrecisionPlan.uniform(model, "float32")
    for path in weighted[: len(weighted) // 2]:
        plan = plan.with_dtype(path, dtype)
    return plan


def alternating_plan(model: keras.Model) -> PrecisionPlan:
    """bfloat16 and float32 alternating among the layers with weights, as `calibrate` times it."""
    infos = describe_model(model)
    assignment = cost.mixed_assignment(model, "bfloat16", "alternating")
    leaves = {path: dtype for path, dtype in assignment.items() if not infos[path].is_container}
    return plan_from_assignment(model, infos, leaves)


def transferred_plan(dtypes: dict[str, str]) -> Callable[[keras.Model], PrecisionPlan]:
    """A plan maker giving each layer of a rebuilt model the dtype of the layer at its position.

    `dtypes` is `{path: dtype}` of the calibrated model's leaf layers; a rebuilt
    model has the same layers in the same order, under other automatic names.
    """
    order = list(dtypes)

    def make(model: keras.Model) -> PrecisionPlan:
        infos = describe_model(model)
        leaves = [path for path in layer_paths(model) if not infos[path].is_container]
        if len(leaves) != len(order):
            raise SystemExit(f"rebuilt {model.name} has {len(leaves)} layers, not {len(order)}")
        return plan_from_assignment(model, infos, dict(zip(leaves, dtypes.values(), strict=True)))

    return make


def leaf_dtypes(model: keras.Model, plan: PrecisionPlan) -> dict[str, str]:
    """`{path: dtype}` of every leaf layer of `model` under `plan`, followers resolved."""
    infos = describe_model(model)
    resolved = plan.resolve()
    return {
        path: resolved.get(path, "float32")
        for path in layer_paths(model)
        if not infos[path].is_container
    }


def build_planned(name: str, make_plan: Callable[[keras.Model], PrecisionPlan]) -> keras.Model:
    """The float32 model with `make_plan(model)` applied, compiled (loss scaling for float16)."""
    keras.config.set_dtype_policy("float32")
    model = build_model(name)
    plan = make_plan(model)
    apply_plan(model, plan)
    optimizer = keras.optimizers.Adam()
    if "float16" in plan.resolve().values():
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return model


def _has_float16(row: str, plans: dict) -> bool:
    if row in plans:
        return "float16" in plans[row].values()
    return "float16" in (row, MIXED.get(row))


def timed_step(model: keras.Model, batch) -> float:
    """Seconds of one `train_on_batch` step."""
    start = time.perf_counter()
    model.train_on_batch(*batch)
    return time.perf_counter() - start


def measure_steps(
    name: str, batch, repeats: int, float16_repeats: int, plans: dict[str, dict[str, str]]
) -> dict[str, float | None]:
    """Median seconds of real steps per row (policy or mixed plan), timed in interleaved rounds.

    `plans` are the `PLANNED` rows' leaf dtypes on the calibrated model. Rows
    without float16 get two warm-up steps and `repeats` timed ones; rows with
    float16 layers one warm-up step and `float16_repeats` timed ones (`None`
    when 0).
    """
    keras.backend.clear_session()
    counts = {row: float16_repeats if _has_float16(row, plans) else repeats for row in ROWS}
    models = {row: build_compiled(name, policy) for row, policy in POLICIES.items() if counts[row]}
    for row, dtype in MIXED.items():
        if counts[row]:
            models[row] = build_planned(name, lambda model, dtype=dtype: half_plan(model, dtype))
    for row, dtypes in plans.items():
        if counts[row]:
            models[row] = build_planned(name, transferred_plan(dtypes))
    for row, model in models.items():
        for _ in range(1 if _has_float16(row, plans) else 2):
            model.train_on_batch(*batch)
    runs = {row: lambda model=model: timed_step(model, batch) for row, model in models.items()}
    samples = interleave(runs, repeats, limits=counts)
    return {row: statistics.median(samples[row]) if samples.get(row) else None for row in ROWS}


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What `predict_steps` found: predicted steps per row and the tables' figures."""

    predicted: dict[str, float]
    no_boundary: dict[str, float]
    old: dict[str, float]
    plans: dict[str, dict[str, str]]
    whole_steps: list[str]
    calibration_seconds: float
    mixed_seconds: float
    relative_error: float
    prediction_errors: dict[str, float]
    demoted: dict[str, int]


def predict_steps(
    name: str, batch, repeats: int, cache_dir: str, dtypes: tuple, time_mixed: bool
) -> Calibration:
    """Predicted seconds per step for each row, with and without boundary cost and per-dtype steps.

    `calibration_seconds` is the default calibration's time, mixed steps
    included; with `time_mixed`, `mixed_seconds` is the time of its two mixed
    plans built, traced and timed alone (what they add to it), else `nan`.
    """
    keras.backend.clear_session()
    model = build_compiled(name, "float32")
    settings = dict(dtypes=dtypes, repeats=repeats, cache_dir=cache_dir, verbose=0)
    start = time.perf_counter()
    table = cost.calibrate(model, batch, **settings)
    calibration_seconds = time.perf_counter() - start
    mixed_seconds = math.nan
    if time_mixed:
        own = {
            key: plan.dtypes
            for key, plan in cost.mixed_plans(model, dtypes).items()
            if key in table.measured_plan_seconds
        }
        start = time.perf_counter()
        cost.time_train_steps(model, batch, [], max(repeats, 3), plans=own)
        mixed_seconds = time.perf_counter() - start
    old_table = cost.calibrate(model, batch, measure_model_step=["float32"], **settings)
    no_boundary = dataclasses.replace(table, boundary_seconds={}, relative_error=0.0)
    halves = [dtype for dtype in dtypes if dtype != "float32"]
    heuristic = heuristic_plan(model, costs=table, hardware="local", dtypes=list(dtypes))
    unguarded = heuristic_plan(model, costs=no_boundary, hardware="local", dtypes=list(dtypes))
    plans = {
        "alt-bf16": leaf_dtypes(model, alternating_plan(model)) if "bfloat16" in halves else None,
        "heur": leaf_dtypes(model, heuristic),
        "heur-0": leaf_dtypes(model, unguarded),
    }
    plans = {row: dtypes_ for row, dtypes_ in plans.items() if dtypes_ is not None}
    mixed = {row: half_plan(model, dtype) for row, dtype in MIXED.items()}

    def steps(costs: cost.CostTable) -> dict[str, float]:
        uniform = {
            d: cost.estimate(model, d, costs=costs).step_seconds if d in dtypes else math.inf
            for d in POLICIES
        }
        half = {
            row: cost.estimate(model, plan, costs=costs).step_seconds
            if MIXED[row] in dtypes
            else math.inf
            for row, plan in mixed.items()
        }
        planned = {
            row: cost.estimate(model, assignment, costs=costs).step_seconds
            for row, assignment in plans.items()
        }
        return uniform | half | planned

    def demoted(plan: PrecisionPlan) -> int:
        return sum(dtype != "float32" for dtype in plan.layers.values())

    return Calibration(
        predicted=steps(table),
        no_boundary=steps(dataclasses.replace(table, boundary_seconds={})),
        old=steps(old_table),
        plans=plans,
        whole_steps=sorted(table.measured_step_seconds_by_dtype),
        calibration_seconds=calibration_seconds,
        mixed_seconds=mixed_seconds,
        relative_error=table.relative_error,
        prediction_errors=dict(table.prediction_errors),
        demoted={"heur": demoted(heuristic), "heur-0": demoted(unguarded)},
    )


def ranking(steps: dict) -> str:
    """The uniform policies, fastest first."""
    known = {
        dtype: steps[dtype]
        for dtype in POLICIES
        if steps.get(dtype) is not None and not math.isinf(steps[dtype])
    }
    return " < ".join(sorted(known, key=known.get))


def ranking_agrees(measured: dict, predicted: dict, tie: float = 0.05) -> bool:
    """Whether every pair of policies the measurement separates by > `tie` is ordered alike."""
    for first in POLICIES:
        for second in POLICIES:
            if measured[first] is None or measured[second] is None:
                continue
            gap = measured[first] / measured[second] - 1
            if gap > tie and predicted[first] <= predicted[second]:
                return False
    return True


def same_ranking(measured: dict, predicted: dict) -> bool:
    """Whether the predicted order of the measured policies is the measured order."""
    known = [dtype for dtype in POLICIES if measured[dtype] is not None]
    return ranking({d: measured[d] for d in known}) == ranking({d: predicted[d] for d in known})


def run(
    models,
    batch_size: int,
    repeats: int,
    float16_repeats: dict,
    cache_dir: str,
    dtypes: tuple,
    time_mixed: bool,
) -> list:
    rows = []
    for name in models:
        batch = make_batch(name, batch_size)
        # Calibrated first: the heuristic rows are plans made from its table.
        calibration = predict_steps(name, batch, 3, cache_dir, dtypes, time_mixed)
        measured = measure_steps(name, batch, repeats, float16_repeats[name], calibration.plans)
        rows.append({"model": name, "measured": measured, **dataclasses.asdict(calibration)})
        print_row(rows[-1])
    return rows


def _ratio(steps: dict, dtype: str) -> float | None:
    value, reference = steps.get(dtype), steps.get("float32")
    if value is None or reference is None or math.isinf(value) or math.isinf(reference):
        return None
    return value / reference


def _error(row: dict, key: str, name: str) -> float | None:
    """`key`'s predicted ratio to float32 over the measured one, minus 1."""
    measured, predicted = _ratio(row["measured"], name), _ratio(row[key], name)
    if measured is None or predicted is None:
        return None
    return predicted / measured - 1


def _cell(value: float | None, pattern: str, width: int) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return f"{'-':>{width}}"
    return f"{format(value, pattern):>{width}}"


def _verdict(measured: dict, predicted: dict) -> str:
    exact = "RIGHT" if same_ranking(measured, predicted) else "WRONG"
    tied = "RIGHT" if ranking_agrees(measured, predicted) else "WRONG"
    return f"{exact} (ignoring measured ties within 5%: {tied})"


def print_row(row: dict) -> None:
    measured, predicted, old = row["measured"], row["predicted"], row["old"]
    own = ", ".join(f"{what} {error:+.1%}" for what, error in row["prediction_errors"].items())
    print(
        f"\n{row['model']} (calibration {row['calibration_seconds']:.0f} s, of which its "
        f"mixed steps {_cell(row['mixed_seconds'], '.0f', 0).strip()} s timed alone; whole "
        f"steps calibrated: {', '.join(row['whole_steps'])})\n"
        f"  table's relative_error +/-{row['relative_error']:.1%} ({own or 'no mixed step'}); "
        f"heuristic demotes {row['demoted']['heur']} layers ({row['demoted']['heur-0']} with "
        f"no boundary cost and no margin)\n"
        f"  ranking measured {ranking(measured)}; predicted {ranking(predicted)}: "
        f"{_verdict(measured, predicted)}; old {ranking(old)}: {_verdict(measured, old)}",
        flush=True,
    )
    if row["plans"].get("heur") == row["plans"].get("heur-0"):
        print("  (heur-0 is the same plan as heur: their gap is the noise between two copies)")
    print(
        f"  {'row':<10} {'meas ms':>9} {'pred ms':>9} {'nobnd ms':>9} {'old ms':>9} "
        f"{'meas ratio':>11} {'pred ratio':>11} {'pred err':>9} {'nobnd err':>10} {'old err':>8}"
    )
    for name in ROWS:
        if name not in predicted:
            continue
        label = name + ("*" if name in row["whole_steps"] else "")
        value = measured.get(name)
        print(
            f"  {label:<10} {_cell(value and value * 1e3, '.1f', 9)} "
            f"{_cell(predicted[name] * 1e3, '.1f', 9)} "
            f"{_cell(row['no_boundary'][name] * 1e3, '.1f', 9)} "
            f"{_cell(old[name] * 1e3, '.1f', 9)} "
            f"{_cell(_ratio(measured, name), '.2f', 11)} "
            f"{_cell(_ratio(predicted, name), '.2f', 11)} "
            f"{_cell(_error(row, 'predicted', name), '+.0%', 9)} "
            f"{_cell(_error(row, 'no_boundary', name), '+.0%', 10)} "
            f"{_cell(_error(row, 'old', name), '+.0%', 8)}",
            flush=True,
        )


def _errors(rows: list, key: str, names: tuple[str, ...]) -> list[tuple[float, float]]:
    """`(|error|, table's relative_error)` of each measured row of `names` under `key`."""
    found = []
    for row in rows:
        for name in names:
            error = _error(row, key, name) if name in row[key] else None
            if error is not None:
                found.append((abs(error), row["relative_error"]))
    return found


def _within(rows: list, key: str, names: tuple[str, ...], tolerance: float = 0.25) -> str:
    """`"k/n"`: how many measured ratios of `names` the `key` prediction gets within `tolerance`."""
    errors = [error for error, _ in _errors(rows, key, names)]
    return f"{sum(error <= tolerance for error in errors)}/{len(errors)}"


def summarise(rows: list) -> str:
    """Returns the closing lines: rankings right, ratios within 25%, the mixed plans' errors."""
    lines = []
    mixed = (*MIXED, *PLANNED)
    for key in ("predicted", "old"):
        right = sum(same_ranking(row["measured"], row[key]) for row in rows)
        tied = sum(ranking_agrees(row["measured"], row[key]) for row in rows)
        lines.append(
            f"{key}: ranking right {right}/{len(rows)} ({tied}/{len(rows)} ignoring measured "
            f"ties within 5%), uniform 16-bit ratios within 25% "
            f"{_within(rows, key, ('bfloat16', 'float16'))}, mixed plans within 25% "
            f"{_within(rows, key, mixed)}"
        )
    for key, label in (
        ("predicted", "with the boundary cost"),
        ("no_boundary", "before the boundary cost"),
        ("old", "float32 step only"),
    ):
        errors = _errors(rows, key, mixed)
        if not errors:
            continue
        median = statistics.median(error for error, _ in errors)
        worst = max(error for error, _ in errors)
        covered = sum(error <= bound for error, bound in errors)
        lines.append(
            f"mixed plans {label}: median |error| {median:.1%}, largest {worst:.1%}; "
            f"within the table's relative_error {covered}/{len(errors)}"
        )
    return "\n".join(lines)


def _host() -> str:
    """The CPU's name and its 16-bit flags (`lscpu`), and its CPU count."""
    flags = ", ".join(host.sixteen_bit_flags()) or "no 16-bit flags"
    return f"{host.cpu_model()} ({host.cores()} cpus; {flags})"


def main() -> None:
    global IMAGE_SIZE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the 4x Dense(2048) MLP and the Transformer, no float16, fewer repeats",
    )
    parser.add_argument(
        "--models", default=None, help=f"comma-separated subset of {MODELS + EXTRA_MODELS}"
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=IMAGE_SIZE)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--dtypes",
        default=None,
        help="dtypes calibrated (default float32,bfloat16,float16; --quick: float32,bfloat16)",
    )
    parser.add_argument(
        "--float16-repeats", type=int, default=1, help="timed float16 steps (slow on a CPU)"
    )
    parser.add_argument(
        "--skip-float16-measure",
        default="",
        help="comma-separated models whose real float16 step is not measured ('all': every one)",
    )
    parser.add_argument("--cache-dir", default=None, help="cost cache (default: a temp folder)")
    parser.add_argument(
        "--time-mixed-steps",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time calibrate's mixed steps alone, for their share of its time",
    )
    args = parser.parse_args()
    IMAGE_SIZE = args.image_size
    models = (
        args.models.split(",")
        if args.models
        else (["mlp", "transformer"] if args.quick else list(MODELS))
    )
    default_dtypes = "float32,bfloat16" if args.quick else "float32,bfloat16,float16"
    dtypes = tuple(dtype.strip() for dtype in (args.dtypes or default_dtypes).split(","))
    skipped = set(
        models if args.skip_float16_measure == "all" else args.skip_float16_measure.split(",")
    )
    if "float16" not in dtypes:
        skipped = set(models)
    float16_repeats = {name: 0 if name in skipped else args.float16_repeats for name in models}
    repeats = args.repeats or (3 if args.quick else 7)
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="autoprec-bench-")
    print(
        f"{_host()}; keras {keras.__version__}, batch {args.batch_size}, "
        f"{IMAGE_SIZE}x{IMAGE_SIZE} images, dtypes {','.join(dtypes)}, repeats {repeats} "
        f"(float16: {args.float16_repeats}), cache {cache_dir}"
    )
    start = time.perf_counter()
    rows = run(
        models, args.batch_size, repeats, float16_repeats, cache_dir, dtypes, args.time_mixed_steps
    )
    print("\n" + summarise(rows))
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
