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
import dataclasses
import json
import math
import os
import platform
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


def host_name() -> str:
    """The CPU's model name as `lscpu` prints it (the platform's processor otherwise)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        text = ""
    for line in text.splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _finite(model: keras.Model) -> bool:
    return all(np.isfinite(weight).all() for weight in model.get_weights())


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
    survived = promoted and np.isfinite(history.history["loss"][-1]) and _finite(model)
    return survived, not _finite(model)


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
    return trained and _finite(model), not _finite(model)


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
    return (not promoted) and _finite(model), not _finite(model)


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
    return scale >= 1.0 and _finite(model), not _finite(model)


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
    return fell_back and np.isfinite(history.history["loss"][0]), not _finite(model)


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


class StepLedger(keras.callbacks.Callback):
    """Numbers the train steps that were lost: skipped by the optimizer, or left non-finite weights.

    Placed after `AutoPrecision` in `callbacks`, so it sees the optimizer the
    plan wrapped (a skipped step moves its `non_finite_steps` counter).
    """

    def __init__(self) -> None:
        super().__init__()
        self.step = 0
        self.lost: list[int] = []
        self._skipped = 0

    def on_train_begin(self, logs=None) -> None:
        self._skipped = self._skipped_so_far()

    def _skipped_so_far(self) -> int:
        counter = getattr(self.model.optimizer, "non_finite_steps", None)
        return int(keras.ops.convert_to_numpy(counter)) if counter is not None else 0

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.step += 1
        skipped = self._skipped_so_far()
        if skipped > self._skipped or not _finite(self.model):
            self.lost.append(self.step)
        self._skipped = skipped


@dataclasses.dataclass(frozen=True)
class Recovery:
    """How a guarded run came through one training fault."""

    fault: str
    steps: int
    onset: int  # the first step the fault reaches
    lost: int
    lost_from_onset: int
    last_lost_step: int
    promoted: tuple[str, ...]
    weights_finite: bool
    last_epoch_finite: bool
    final_loss: float
    float32_loss: float
    raised: bool | None = None  # on_nan="raise" raised NonFiniteTrainingError (NaN fault only)

    @property
    def loss_ratio(self) -> float:
        return self.final_loss / self.float32_loss if self.float32_loss else math.nan

    @property
    def recovered(self) -> bool:
        close = math.isfinite(self.loss_ratio) and abs(self.loss_ratio - 1.0) <= 0.05
        return (
            self.weights_finite
            and close
            and self.raised is not False
            and (self.last_epoch_finite or self.raised is not None)
        )

    def as_dict(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "loss_ratio": self.loss_ratio,
            "recovered": self.recovered,
        }


def _drift_model() -> keras.Model:
    """Dense stack whose middle layer's outputs pass 65504 when the inputs grow 3000x."""
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu", name="d1"),
            keras.layers.Dense(16, name="middle"),
            keras.layers.Dense(16, activation="relu", name="d3"),
            keras.layers.Dense(1, name="head"),
        ],
        name="drift",
    )
    # Learning rate 0: with outputs near 1e6 any step size makes two runs that
    # skipped different steps diverge, so the final losses compare the numerics of
    # the promoted plan with float32 (a non-finite update still writes NaN: 0 * inf).
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    kernel, bias = model.get_layer("middle").get_weights()
    model.get_layer("middle").set_weights([np.abs(kernel) * 60.0, bias])
    return model


def _twin(model: keras.Model, loss) -> keras.Model:
    """A float32 copy of `model` with its weights, compiled with the same optimizer settings."""
    copy = keras.Sequential.from_config(model.get_config())
    copy.set_weights(model.get_weights())
    copy.compile(
        optimizer=model.optimizer.__class__.from_config(model.optimizer.get_config()), loss=loss
    )
    return copy


def _guarded_fit(model, plan, x, y, epochs, batch_size, **options):
    callback = autoprec.AutoPrecision(plan, verbose=0, **options)
    ledger = StepLedger()
    history = model.fit(
        x,
        y,
        batch_size=batch_size,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=[callback, ledger],
    )
    return callback, ledger, history


def _recovery(
    fault, onset, model, reference, callback, ledger, history, clean, raised=None
) -> Recovery:
    promoted = tuple(
        f"{event['layer']} {event['from']}->{event['to']} @{event['step']}"
        for event in callback.plan.events
        if event.get("kind") == "promotion"
    )
    return Recovery(
        fault=fault,
        steps=ledger.step,
        onset=onset,
        lost=len(ledger.lost),
        lost_from_onset=sum(step >= onset for step in ledger.lost),
        last_lost_step=max(ledger.lost, default=0),
        promoted=promoted,
        weights_finite=_finite(model),
        last_epoch_finite=bool(np.isfinite(history.history["loss"][-1])),
        final_loss=float(model.evaluate(*clean, verbose=0, batch_size=64)),
        float32_loss=float(reference.evaluate(*clean, verbose=0, batch_size=64)),
        raised=raised,
    )


def guard_data_drift(steps: int = 20, batch_size: int = 8, epochs: int = 2) -> Recovery:
    """Float16 plan; the second half of each epoch's inputs is 3000x larger."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model = _drift_model()
    reference = _twin(model, "mse")
    rng = np.random.default_rng(0)
    x = np.abs(rng.normal(size=(steps * batch_size, 8))).astype("float32")
    x[steps // 2 * batch_size :] *= 3000.0
    y = np.zeros((len(x), 1), "float32")
    plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    callback, ledger, history = _guarded_fit(model, plan, x, y, epochs, batch_size)
    reference.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    onset = steps // 2 + 1
    return _recovery(
        "data drift (float16)", onset, model, reference, callback, ledger, history, (x, y)
    )


def guard_nan_batch(steps: int = 20, batch_size: int = 8, epochs: int = 2) -> Recovery:
    """Bfloat16-only plan; one batch of each epoch holds NaN."""
    rng = np.random.default_rng(0)
    x = np.abs(rng.normal(size=(steps * batch_size, 8))).astype("float32")
    y = np.zeros((len(x), 1), "float32")
    bad = slice(5 * batch_size, 6 * batch_size)  # the sixth batch
    poisoned = x.copy()
    poisoned[bad] = np.nan
    clean = (
        np.delete(x, np.arange(len(x))[bad], axis=0),
        np.delete(y, np.arange(len(y))[bad], axis=0),
    )

    def build() -> keras.Model:
        keras.backend.clear_session()
        keras.utils.set_random_seed(0)
        model = _drift_model()
        kernel, bias = model.get_layer("middle").get_weights()
        model.get_layer("middle").set_weights([kernel / 60.0, bias])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        return model

    model = build()
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16")
    try:
        _guarded_fit(
            model, plan, poisoned, y, epochs, batch_size, guard=autoprec.Guard(on_nan="raise")
        )
        raised = False
    except autoprec.NonFiniteTrainingError:
        raised = True
    model = build()
    reference = _twin(model, "mse")
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16")
    callback, ledger, history = _guarded_fit(model, plan, poisoned, y, epochs, batch_size)
    reference.fit(*clean, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    return _recovery(
        "NaN batch (bfloat16 only)", 6, model, reference, callback, ledger, history, clean, raised
    )


def guard_gradient_overflow(samples: int = 256, batch_size: int = 16, epochs: int = 3) -> Recovery:
    """Float16 plan; a loss weighted 1e6 whose gradients overflow float16 even at scale 1."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)

    def loss(target, prediction):
        return 1e6 * keras.ops.mean((target - prediction) ** 2)

    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu", name="a"),
            keras.layers.Dense(16, activation="relu", name="b"),
            keras.layers.Dense(1, name="head"),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(1e-9), loss=loss)
    reference = _twin(model, loss)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 8)).astype("float32")
    y = rng.normal(size=(samples, 1)).astype("float32")
    plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("head", "float32")
    floor = autoprec.LossScale(floor=2.0**-10)  # lets the guard take the scale below 1
    callback, ledger, history = _guarded_fit(
        model, plan, x, y, epochs, batch_size, loss_scale=floor
    )
    reference.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    return _recovery(
        "gradients too large at scale 1 (float16)",
        1,
        model,
        reference,
        callback,
        ledger,
        history,
        (x, y),
    )


def guard_recoveries() -> list[Recovery]:
    """Runs the three guard faults once each."""
    return [guard_data_drift(), guard_nan_batch(), guard_gradient_overflow()]


def print_recoveries(results: list[Recovery]) -> None:
    width = max(len(result.fault) for result in results)
    header = (
        f"{'fault':<{width}}  steps  onset  lost  from onset  last lost  weights finite  final loss  float32 loss"
        "  ratio  raised  recovered"
    )
    print("\n" + header)
    print("-" * len(header))
    for r in results:
        raised = "-" if r.raised is None else ("yes" if r.raised else "NO")
        print(
            f"{r.fault:<{width}}  {r.steps:>5}  {r.onset:>5}  {r.lost:>4}  {r.lost_from_onset:>10}  "
            f"{r.last_lost_step:>9}  "
            f"{'yes' if r.weights_finite else 'NO':>14}  {r.final_loss:>10.4g}  "
            f"{r.float32_loss:>12.4g}  {r.loss_ratio:>5.3f}  {raised:>6}  "
            f"{'yes' if r.recovered else 'NO':>9}"
        )
        print(f"{'':<{width}}  promoted: {', '.join(r.promoted) or 'nothing'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer injections")
    parser.add_argument("--smoke", action="store_true", help="only the guard faults, once")
    args = parser.parse_args(argv)
    started = time.time()
    recoveries = guard_recoveries()
    if args.smoke:
        print(f"host: {host_name()}")
        print_recoveries(recoveries)
        print(f"({time.time() - started:.0f} s)")
        print(json.dumps({"host": host_name(), "faults": [r.as_dict() for r in recoveries]}))
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
    print(f"host: {host_name()}")
    print_recoveries(recoveries)
    print(json.dumps({"host": host_name(), "faults": [r.as_dict() for r in recoveries]}))


if __name__ == "__main__":
    main()
