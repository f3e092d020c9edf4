"""Fault injection: count what survives. Prints fault / injected / survived / data lost.

Run: python bench/faults.py [--quick] [--smoke]

Training faults run real `fit` calls with `autoprec.AutoPrecision`; file faults
write real broken files; process faults SIGKILL real processes. "Data lost"
counts runs whose weights became non-finite, files that no longer load, and
finished search trials that disappeared: it must be 0.

A second table covers the guard's recovery from three training faults:

- data drift: the inputs of the second half of each epoch are 3000x larger, so
  a middle Dense layer's outputs pass 65504 under a float16 plan;
- a NaN batch under a bfloat16-only plan: with `on_nan="raise"` the run must
  raise `autoprec.NonFiniteTrainingError`; with the default the step must be
  skipped and the weights stay finite;
- gradients too large at the loss-scale floor: a loss weighted 1e6 under a
  float16 plan, finite in float32, whose gradients overflow float16 at scale 1
  (trained with `LossScale(floor=2**-10)`, so the guard may lower the scale below 1).

For each: the step the fault first reaches (onset), the train steps lost
(skipped, or applied with non-finite values) in all and from the onset on (a
float16 run also loses a few first steps while the dynamic loss scale comes
down from 2**15), the last of them, the layers promoted, whether the weights stayed finite,
and the final loss (`evaluate` on the fault-free data) against a float32 copy
trained from the same weights on the same batches (without the NaN batch).
`--smoke` runs only this second table, once; the last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import autoprec  # noqa: E402
from autoprec.layers import layer_paths  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench/, for its shared `common`
from common.host import cpu_model  # noqa: E402
from common.keras_tools import weights_finite  # noqa: E402
from faults_guard import guard_recoveries, print_recoveries  # noqa: E402


def _three_layer_model(big_scale: float) -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, name="first"),
            keras.layers.Dense(8, name="big"),
            keras.layers.Dense(1, name="out"),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(1e-12), loss="mse")
    for name, value in (("first", 0.25), ("big", big_scale), ("out", 1e-6)):
        kernel, bias = model.get_layer(name).get_weights()
        model.get_layer(name).set_weights([np.full_like(kernel, value), bias])
    return model


def _float16_plan(model: keras.Model) -> autoprec.PrecisionPlan:
    return autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32")


def fault_overflow(onset: int) -> tuple[bool, bool]:
    """A layer starts overflowing float16 after `onset` samples; the guard must promote it."""
    keras.backend.clear_session()
    model = _three_layer_model(100.0)
    x = np.concatenate([np.ones((onset, 4)), np.full((120 - onset, 4), 1000.0)]).astype("float32")
    callback = autoprec.AutoPrecision(_float16_plan(model), verbose=0)
    history = model.fit(
        x,
        np.zeros((120, 1), "float32"),
        batch_size=4,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[callback],
    )
    promoted = any(event.get("layer") == "big" for event in callback.plan.events)
    survived = promoted and np.isfinite(history.history["loss"][-1]) and weights_finite(model)
    return survived, not weights_finite(model)


def fault_underflow(loss_factor: float) -> tuple[bool, bool]:
    """Gradients below float16's smallest subnormal; loss scaling must make them train."""
    keras.backend.clear_session()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(
        optimizer=keras.optimizers.SGD(10.0),
        loss=lambda target, prediction: loss_factor * keras.ops.mean((target - prediction) ** 2),
    )
    start = model.layers[0].get_weights()[0].copy()
    plan = autoprec.PrecisionPlan.uniform(model, "float16")
    model.fit(
        np.ones((16, 4), "float32"),
        np.zeros((16, 1), "float32"),
        epochs=2,
        verbose=0,
        callbacks=[autoprec.AutoPrecision(plan, verbose=0)],
    )
    trained = not np.array_equal(model.layers[0].get_weights()[0], start)
    return trained and weights_finite(model), not weights_finite(model)


def fault_nan_input(first_bad: int) -> tuple[bool, bool]:
    """NaN batches in the data: reported, weights kept, no layer promoted."""
    keras.backend.clear_session()
    model = _three_layer_model(0.1)
    x = np.ones((120, 4), "float32")
    x[first_bad : first_bad + 32] = np.nan
    callback = autoprec.AutoPrecision(_float16_plan(model), verbose=0)
    model.fit(
        x,
        np.zeros((120, 1), "float32"),
        batch_size=4,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[callback],
    )
    promoted = any(event["kind"] == "promotion" for event in callback.plan.events)
    return (not promoted) and weights_finite(model), not weights_finite(model)


def fault_loss_scale_collapse(steps: int) -> tuple[bool, bool]:
    """Every step overflows; the scale must stop at its floor and the weights stay finite."""
    keras.backend.clear_session()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    callback = autoprec.AutoPrecision(
        autoprec.PrecisionPlan.uniform(model, "float16"), guard=None, verbose=0
    )
    model.fit(
        np.full((steps, 4), 1e4, "float32"),
        np.zeros((steps, 1), "float32"),
        batch_size=1,
        verbose=0,
        callbacks=[callback],
    )
    scale = float(keras.ops.convert_to_numpy(model.optimizer.dynamic_scale))
    return scale >= 1.0 and weights_finite(model), not weights_finite(model)


def fault_missing_kernel() -> tuple[bool, bool]:
    """A layer whose bfloat16 kernel does not exist on this device must fall back."""
    import tensorflow as tf

    class Determinant(keras.layers.Layer):
        def call(self, inputs):
            matrices = keras.ops.reshape(inputs, (-1, 2, 2)) + keras.ops.eye(2, dtype=inputs.dtype)
            return keras.ops.reshape(tf.linalg.det(matrices), (-1, 1))

    keras.backend.clear_session()
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(1)(Determinant(name="det")(keras.layers.Dense(4)(inputs)))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss="mse")
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16")
    history = model.fit(
        np.ones((16, 4), "float32"),
        np.zeros((16, 1), "float32"),
        verbose=0,
        callbacks=[autoprec.AutoPrecision(plan, verbose=0)],
    )
    fell_back = layer_paths(model)["det"].compute_dtype == "float32"
    return fell_back and np.isfinite(history.history["loss"][0]), not weights_finite(model)


def _broken_plan_texts(model: keras.Model) -> dict[str, str]:
    good = autoprec.PrecisionPlan.uniform(model, "bfloat16").to_json()
    data = json.loads(good)
    texts = {
        f"truncated at {fraction:.0%}": good[: int(len(good) * fraction)]
        for fraction in (0.0, 0.1, 0.5, 0.9, 0.99)
    }
    texts["garbage bytes"] = "\x00\x13not json at all"
    unknown = json.loads(good)
    unknown["layers"]["dense"]["dtype"] = "float8"
    texts["unknown dtype"] = json.dumps(unknown)
    texts["future version"] = json.dumps({**data, "format_version": 99})
    renamed = json.loads(good)
    renamed["layers"]["dense_renamed"] = renamed["layers"].pop("dense")
    texts["renamed layer"] = json.dumps(renamed)
    other = keras.Sequential([keras.Input((5,)), keras.layers.Dense(7, name="other")])
    texts["plan for another model"] = autoprec.PrecisionPlan.uniform(other, "float16").to_json()
    return texts


def fault_broken_plan_files(folder: Path) -> tuple[int, int, int]:
    """Each broken plan file must raise PlanError and leave every policy as it was."""
    keras.backend.clear_session()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(2)])
    before = {path: layer.dtype_policy.name for path, layer in layer_paths(model).items()}
    injected = survived = 0
    for name, text in _broken_plan_texts(model).items():
        injected += 1
        path = folder / f"{name.replace(' ', '_')}.json"
        path.write_text(text)
        try:
            autoprec.apply_plan(model, autoprec.PrecisionPlan.load(path))
        except autoprec.PlanError:
            after = {p: layer.dtype_policy.name for p, layer in layer_paths(model).items()}
            survived += after == before
    return injected, survived, 0


def fault_broken_profile_files(folder: Path) -> tuple[int, int, int]:
    """Truncated or edited profile files must raise ProfileError naming the file."""
    keras.backend.clear_session()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    data = (np.ones((32, 4), "float32"), np.zeros((32, 2), "float32"))
    text = autoprec.profile(model, data, steps=2, batch_size=8).to_json()
    edited = json.loads(text)
    first = next(iter(edited["layers"].values()))
    first["activations"]["output"]["count"] += 1
    variants = {f"truncated {i}": text[: len(text) * i // 5] for i in range(5)}
    variants["count edited"] = json.dumps(edited)
    variants["future version"] = json.dumps({**json.loads(text), "format_version": 99})
    survived = 0
    for name, content in variants.items():
        path = folder / f"profile_{name.replace(' ', '_')}.json"
        path.write_text(content)
        try:
            autoprec.Profile.load(path)
        except autoprec.ProfileError as error:
            survived += str(path) in str(error)
    return len(variants), survived, 0


def fault_kill_while_saving(folder: Path, kills: int) -> tuple[int, int, int]:
    """SIGKILL a process that saves plans in a loop; the file must always load."""
    path = folder / "plan.json"
    autoprec.PrecisionPlan({"x": "float32"}).save(path)
    script = HERE / "plan_writer.py"
    survived = lost = 0
    rng = np.random.default_rng(0)
    for _ in range(kills):
        process = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE)
        process.stdout.readline()
        time.sleep(float(rng.uniform(0.01, 0.3)))
        process.send_signal(signal.SIGKILL)
        process.wait()
        try:
            autoprec.PrecisionPlan.load(path)
            survived += 1
        except autoprec.PlanError:
            lost += 1
    return kills, survived, lost


def fault_kill_search(folder: Path, kills: int) -> tuple[int, int, int]:
    """SIGKILL a search after some trials, resume it; count finished trials lost or duplicated."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    worker = HERE / "search_worker.py"
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    survived = lost = 0
    for attempt in range(kills):
        storage = folder / f"search_{attempt}.log"

        def trials(storage=storage):
            return optuna.load_study(
                study_name="fault_injection",
                storage=JournalStorage(JournalFileBackend(str(storage))),
            ).trials

        process = subprocess.Popen([sys.executable, str(worker), str(storage), "500"])
        before = []
        deadline = time.time() + 300
        while time.time() < deadline and len(before) < 2 + attempt:
            time.sleep(0.5)
            try:
                before = [t for t in trials() if t.state in finished]
            except Exception:  # not created yet
                continue
        process.send_signal(signal.SIGKILL)
        process.wait()
        before = [t for t in trials() if t.state in finished]
        subprocess.run([sys.executable, str(worker), str(storage), "2"], check=True, timeout=300)
        after = {t.number: t for t in trials()}
        missing = [t for t in before if t.number not in after or after[t.number].value != t.value]
        lost += len(missing)
        survived += not missing and len(after) == len(set(after))
    return kills, survived, lost


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer injections")
    parser.add_argument("--smoke", action="store_true", help="only the guard faults, once")
    args = parser.parse_args(argv)
    started = time.time()
    recoveries = guard_recoveries()
    if args.smoke:
        print(f"host: {cpu_model()}")
        print_recoveries(recoveries)
        print(f"({time.time() - started:.0f} s)")
        print(json.dumps({"host": cpu_model(), "faults": [r.as_dict() for r in recoveries]}))
        return
    repeats = 1 if args.quick else 3
    rows: list[tuple[str, int, int, int]] = []

    def training(name: str, function, parameters) -> None:
        results = [function(parameter) for parameter in parameters]
        rows.append(
            (name, len(results), sum(s for s, _ in results), sum(lost for _, lost in results))
        )

    training("layer overflows float16 mid-training", fault_overflow, [40, 60, 80][:repeats])
    training("gradients underflow float16", fault_underflow, [1e-7, 3e-8, 1e-6][:repeats])
    training("NaN in input batches", fault_nan_input, [20, 40, 60][:repeats])
    training("loss-scale collapse (300 bad steps)", fault_loss_scale_collapse, [300] * repeats)
    training("missing bfloat16 kernel", lambda _: fault_missing_kernel(), [None])
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        rows.append(("broken plan files", *fault_broken_plan_files(folder)))
        rows.append(("broken profile files", *fault_broken_profile_files(folder)))
        rows.append(("SIGKILL while saving a plan", *fault_kill_while_saving(folder, 4 * repeats)))
        rows.append(("SIGKILL mid-search, then resume", *fault_kill_search(folder, repeats)))

    width = max(len(row[0]) for row in rows)
    print(f"\n{'fault':<{width}}  injected  survived  data lost")
    print("-" * (width + 31))
    for name, injected, survived, lost in rows:
        print(f"{name:<{width}}  {injected:>8}  {survived:>8}  {lost:>9}")
    total_lost = sum(row[3] for row in rows)
    print(
        f"\n{sum(r[1] for r in rows)} faults injected, {sum(r[2] for r in rows)} survived, "
        f"{total_lost} data lost, in {time.time() - started:.0f} s"
    )
    print(f"host: {cpu_model()}")
    print_recoveries(recoveries)
    print(json.dumps({"host": cpu_model(), "faults": [r.as_dict() for r in recoveries]}))


if __name__ == "__main__":
    main()
