"""The guard's recovery from three training faults: the second table of `bench/faults.py`.

Data drift under a float16 plan, a NaN batch under a bfloat16-only plan, gradients too
large at the loss-scale floor (the faults are described in `bench/faults.py`). Each
run is a `Recovery`: the steps lost, the layers promoted, the final loss against a
float32 copy trained from the same weights on the same batches.
"""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np
from common.keras_tools import weights_finite

import autoprec


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
        if skipped > self._skipped or not weights_finite(self.model):
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
        weights_finite=weights_finite(model),
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
