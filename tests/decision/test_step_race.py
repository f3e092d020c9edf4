"""Tests for `autoprec.decision.race`: candidate plans timed in interleaved steps inside fit.

The verdict on the rounds is `autoprec._core.timing.judge_rounds` (tests/core/test_timing.py).
"""

from __future__ import annotations

import keras
import numpy as np

import autoprec
from autoprec._core.timing import judge_rounds
from autoprec.decision.race import StepRace


class _Racing(keras.callbacks.Callback):
    """Drives a `StepRace` from fit's batch hooks, as `AutoPrecision` does."""

    def __init__(self, race: StepRace) -> None:
        super().__init__()
        self.race = race
        self.steps_after = 0
        self.fit_function = None

    def on_train_batch_begin(self, batch, logs=None):
        if self.fit_function is None:
            self.fit_function = self.model.train_function  # what fit traced for its policies
        if not self.race.finished:
            self.race.begin_step()

    def on_train_batch_end(self, batch, logs=None):
        if self.race.finished:
            self.steps_after += 1
        elif self.race.end_step():
            self.race.close()


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(4),
        ]
    )
    model.compile("adam", "mse")
    return model


def test_the_race_times_every_plan_in_interleaved_rounds_inside_fit():
    model = _model()
    before = [w.copy() for w in model.get_weights()]
    candidates = {
        "float32": autoprec.PrecisionPlan.uniform(model, "float32"),
        "mixed_bfloat16": autoprec.PrecisionPlan.uniform(model, "bfloat16"),
    }
    race = StepRace(model, candidates, rounds=5, steps_per_round=2, max_rounds=7)
    racing = _Racing(race)
    x = np.random.default_rng(0).standard_normal((64 * 16, 32)).astype("float32")
    y = np.random.default_rng(1).standard_normal((64 * 16, 4)).astype("float32")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[racing])

    result = race.result()
    assert race.finished and racing.steps_after > 0
    # Each plan: a traced step and 2 warm-up steps, then 2 timed steps per round.
    assert 5 <= result.rounds_run <= 7
    assert result.steps == 2 * 3 + result.rounds_run * 2 * 2
    assert all(len(figures) == result.rounds_run for figures in result.rounds.values())
    assert result.verdict is not None and result.winner in candidates
    assert result.verdict == judge_rounds(result.rounds, list(candidates).index)
    # float32, the policies fit started with, runs fit's own trace; mixed_bfloat16 is
    # traced once; each plan's function is put back at every switch.
    functions = [candidate.train_function for candidate in race.candidates]
    assert functions[0] is racing.fit_function
    assert functions[1] is not functions[0] and functions[1] is not None
    assert result.traces == 1 and result.to_dict()["traces"] == 1
    # close() put back fit's own trace with the policies it runs, whichever plan ran last.
    assert model.train_function is racing.fit_function
    # The steps trained the model; close() put back the policies the model had.
    after = model.get_weights()
    assert all(np.isfinite(w).all() for w in after)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))
    assert {layer.dtype_policy.name for layer in model.layers} == {"float32"}
    record = result.to_dict()
    assert record["winner"] == result.winner
    assert record["verdict"] in ("separated", "tie")
    assert set(record["median_ms"]) == set(candidates)


def test_training_that_ends_early_leaves_no_verdict():
    model = _model()
    candidates = {
        "float32": autoprec.PrecisionPlan.uniform(model, "float32"),
        "mixed_bfloat16": autoprec.PrecisionPlan.uniform(model, "bfloat16"),
    }
    race = StepRace(model, candidates)
    x = np.zeros((16 * 4, 32), "float32")
    model.fit(x, np.zeros((64, 4), "float32"), batch_size=16, verbose=0, callbacks=[_Racing(race)])
    result = race.result()
    assert not race.finished
    assert result.steps == 4
    assert result.verdict is None
    assert result.to_dict()["steps"] == 4
    race.close()


def test_a_float8_candidate_races_with_one_optimizer_that_knows_its_scales():
    model = _model()
    x = np.random.default_rng(0).standard_normal((64 * 16, 32)).astype("float32")
    y = np.random.default_rng(1).standard_normal((64 * 16, 4)).astype("float32")
    model.fit(x[:32], y[:32], batch_size=16, epochs=1, verbose=0)  # the optimizer is built
    float8 = autoprec.PrecisionPlan.uniform(model, "float8")
    float8 = float8.with_dtype(list(float8.layers)[-1], "float32")
    candidates = {
        "mixed_bfloat16": autoprec.PrecisionPlan.uniform(model, "bfloat16"),
        "float8": float8,
    }
    race = StepRace(model, candidates, rounds=3, steps_per_round=2, max_rounds=3)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[_Racing(race)])
    result = race.result()
    assert result.verdict is not None and set(result.rounds) == {"mixed_bfloat16", "float8"}
    first = model.layers[0]
    assert first.quantization_mode is None  # the race put the policies back
    assert all(not variable.trainable for variable in first.weights[2:])
    scale = float(keras.ops.convert_to_numpy(first.inputs_scale))
    assert scale != 1.0  # the float8 candidate's steps updated its scales
    assert all(np.isfinite(w).all() for w in model.get_weights())
