"""Tests for `autoprec.runtime.step_race`: the verdict on timed rounds, and the race inside fit."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import autoprec
from autoprec.runtime.step_race import (
    MAX_TOLERANCE,
    MIN_TOLERANCE,
    StepRace,
    judge_rounds,
    rounds_tolerance,
)

ORDER = ["float32", "mixed_bfloat16", "per-layer"]


def test_a_clearly_faster_plan_wins():
    verdict = judge_rounds(
        {
            "float32": [1.00, 1.01, 1.02, 1.00, 1.01],
            "mixed_bfloat16": [0.95, 0.96, 0.97, 0.95, 0.96],
            "per-layer": [0.70, 0.71, 0.72, 0.70, 0.71],
        },
        ORDER,
    )
    assert verdict.winner == "per-layer"
    assert not verdict.tie
    assert verdict.decided
    assert verdict.speedup("per-layer", "float32") == pytest.approx(1.01 / 0.71)


def test_a_difference_inside_the_noise_goes_to_the_simpler_plan():
    verdict = judge_rounds(
        {"float32": [1.00, 1.02, 1.01, 1.00, 1.03], "per-layer": [0.99, 1.00, 1.01, 0.99, 1.0]},
        ORDER,
    )
    assert verdict.fastest == "per-layer"
    assert verdict.winner == "float32"
    assert verdict.tie


def test_a_split_between_median_and_fastest_round_goes_to_the_simpler_plan():
    # per-layer has the lower median by 10 %, float32 the fastest round.
    verdict = judge_rounds(
        {"float32": [0.60, 1.00, 1.00, 1.00, 1.00], "per-layer": [0.90, 0.90, 0.90, 0.90, 0.90]},
        ORDER,
    )
    assert verdict.winner == "float32"


def test_the_simplest_of_several_unbeaten_plans_wins():
    verdict = judge_rounds(
        {
            "float32": [1.00] * 5,
            "mixed_bfloat16": [0.80, 0.80, 0.81, 0.80, 0.80],
            "per-layer": [0.78, 0.79, 0.79, 0.78, 0.79],
        },
        ORDER,
    )
    assert verdict.winner == "mixed_bfloat16"
    assert verdict.fastest == "per-layer"


def test_noisy_rounds_widen_the_tolerance_within_bounds():
    assert rounds_tolerance({"a": [1.0, 1.0, 1.0]}) == MIN_TOLERANCE
    assert rounds_tolerance({"a": [0.1, 1.0, 1.0]}) == MAX_TOLERANCE
    assert rounds_tolerance({"a": [0.9, 1.0, 1.1], "b": [1.8, 2.0, 2.2]}) == pytest.approx(0.1)
    # A 12 % gain is real in quiet rounds and noise in rounds that spread by 20 %.
    quiet = judge_rounds({"float32": [1.0, 1.0, 1.01], "per-layer": [0.88, 0.88, 0.89]}, ORDER)
    noisy = judge_rounds({"float32": [0.8, 1.0, 1.2], "per-layer": [0.7, 0.88, 1.1]}, ORDER)
    assert quiet.winner == "per-layer"
    assert noisy.winner == "float32"


def test_an_undecided_verdict_asks_for_more_rounds():
    # 4 % apart with 3 % tolerance: the verdict flips at twice the tolerance.
    verdict = judge_rounds({"float32": [1.0, 1.0, 1.0], "per-layer": [0.96, 0.96, 0.96]}, ORDER)
    assert verdict.winner == "per-layer"
    assert not verdict.decided


def test_no_timed_round_is_an_error():
    with pytest.raises(ValueError, match="no plan has a timed round"):
        judge_rounds({"float32": []}, ORDER)


class _Racing(keras.callbacks.Callback):
    """Drives a `StepRace` from fit's batch hooks, as `AutoPrecision` does."""

    def __init__(self, race: StepRace) -> None:
        super().__init__()
        self.race = race
        self.steps_after = 0

    def on_train_batch_begin(self, batch, logs=None):
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
    race = StepRace(model, candidates, rounds=5, steps_per_round=2, max_rounds=6)
    racing = _Racing(race)
    x = np.random.default_rng(0).standard_normal((64 * 16, 32)).astype("float32")
    y = np.random.default_rng(1).standard_normal((64 * 16, 4)).astype("float32")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[racing])

    result = race.result()
    assert race.finished and racing.steps_after > 0
    # Each plan: a traced step and 2 warm-up steps, then 2 timed steps per round.
    assert result.rounds_run in (5, 6)
    assert result.steps == 2 * 3 + result.rounds_run * 2 * 2
    assert all(len(figures) == result.rounds_run for figures in result.rounds.values())
    assert result.verdict is not None and result.verdict.winner in candidates
    assert result.verdict == judge_rounds(result.rounds, list(candidates))
    # Each plan traced once, then its own function put back at every switch.
    functions = [candidate.train_function for candidate in race.candidates]
    assert functions[0] is not functions[1] and None not in functions
    # The steps trained the model; close() put back the policies the model had.
    after = model.get_weights()
    assert all(np.isfinite(w).all() for w in after)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))
    assert {layer.dtype_policy.name for layer in model.layers} == {"float32"}
    record = result.to_dict()
    assert record["winner"] == result.verdict.winner
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
