"""Tests for `autoprec.search.confirmation` and its verdict (`rounds`): the measured ranking
and the longer confirmation.

The ranking's decision (`judge_rounds`, `measured_ranking`, `rank_by_measurement`) is fed
measured rounds as plain values, so that its cases cannot flake on a loaded machine;
`order_by_measurement` and `confirm_plan` run on real small
models, asserting on structure and decisions, never on timings.
"""

from __future__ import annotations

import keras
import optuna
import pytest
from search.search_models import far_regression, far_targets, prepared_search

from autoprec._core.timing import (
    MAX_ROUNDS,
    MIN_ROUNDS,
    NOISE_FLOOR,
    judge_rounds,
    margin_of,
    next_rounds,
    wants_more_rounds,
)
from autoprec.search import Budget, TrialRecord
from autoprec.search.confirmation import (
    MeasuredRanking,
    chosen_step_timing,
    confirm_plan,
    order_by_measurement,
    rank_by_measurement,
    verdict_line,
)
from autoprec.search.record import simplicity


def measured_ranking(rounds):
    return list(judge_rounds(rounds, simplicity).order)


def _trial(number: int, value: float, record: TrialRecord) -> optuna.trial.FrozenTrial:
    """A completed trial within budget, as a real study stores it."""
    study = optuna.create_study()
    for _ in range(number):  # trial numbers come from the study
        study.add_trial(optuna.trial.create_trial(value=99.0))
    study.add_trial(
        optuna.trial.create_trial(
            value=value, user_attrs=record.to_user_attrs(), constraints={"budget": -1.0}
        )
    )
    return study.trials[-1]


@pytest.fixture
def ranked() -> list[optuna.trial.FrozenTrial]:
    """A searched plan (cheapest predicted), the uniform bfloat16 plan and float32, by cost."""
    return [
        _trial(5, 1.0, TrialRecord(assignment={"a": "bfloat16", "b": "float32"})),
        _trial(1, 2.0, TrialRecord(warm_start="uniform bfloat16", assignment={"a": "bfloat16"})),
        _trial(0, 3.0, TrialRecord(warm_start="float32", assignment={"a": "float32"})),
    ]


def _timed(ranked):
    return {"searched": ranked[0], "float32": ranked[2], "uniform bfloat16": ranked[1]}


def test_a_plan_clearly_beaten_is_not_kept_at_the_head(ranked):
    rounds = {
        "searched": [0.90, 0.91, 0.92],  # beaten by bfloat16 in both median and fastest
        "uniform bfloat16": [0.50, 0.52, 0.55],
        "float32": [0.95, 0.97, 0.99],
    }
    ranking = rank_by_measurement(ranked, _timed(ranked), rounds)
    assert isinstance(ranking, MeasuredRanking)
    assert ranking.order == ("uniform bfloat16", "searched", "float32")
    assert [t.number for t in ranking.trials] == [1, 5, 0]
    assert (ranking.replaced_by, ranking.replacing_trial) == ("uniform bfloat16", 1)
    assert ranking.fastest == {"searched": 0.90, "uniform bfloat16": 0.50, "float32": 0.95}
    assert ranking.names == {5: "searched", 0: "float32", 1: "uniform bfloat16"}


def test_a_split_decision_goes_to_the_simpler_plan(ranked):
    rounds = {
        "searched": [0.80, 0.90, 0.91],  # fastest round
        "uniform bfloat16": [0.82, 0.85, 0.86],  # median
        "float32": [2.0, 2.1, 2.2],
    }
    ranking = rank_by_measurement(ranked, _timed(ranked), rounds)
    assert ranking.order[0] == "uniform bfloat16" and ranking.trials[0].number == 1
    clear = {**rounds, "searched": [0.70, 0.71, 0.72]}
    kept = rank_by_measurement(ranked, _timed(ranked), clear)
    assert kept.order[0] == "searched" and kept.trials[0].number == 5
    assert kept.replaced_by is None and kept.replacing_trial is None


def test_float32_first_but_not_among_the_trials_leaves_no_trial(ranked):
    timed = {"searched": ranked[0], "float32": None}
    ranking = rank_by_measurement(ranked[:2], timed, {"searched": [2.0], "float32": [1.0]})
    assert ranking.trials == () and ranking.order == ("float32", "searched")


def test_trials_not_timed_follow_by_predicted_cost(ranked):
    extra = _trial(7, 2.5, TrialRecord(neighbour="a -> bfloat16", assignment={"a": "x"}))
    timed = {"searched": ranked[0], "float32": ranked[2]}
    rounds = {"searched": [0.5, 0.6], "float32": [0.9, 1.0]}
    ranking = rank_by_measurement([ranked[0], extra, ranked[2]], timed, rounds)
    assert [t.number for t in ranking.trials] == [5, 0, 7]


def test_order_by_measurement_times_each_candidate_and_reorders_real_trials():
    with prepared_search(hardware="local") as prepared:
        context = prepared.context
        study = optuna.create_study()
        for label, dtype in (("float32", "float32"), ("uniform bfloat16", "bfloat16")):
            record = TrialRecord(warm_start=label, assignment=context.uniform_assignment(dtype))
            study.add_trial(
                optuna.trial.create_trial(
                    value=1.0 if dtype == "bfloat16" else 2.0,
                    user_attrs=record.to_user_attrs(),
                    constraints={"budget": -1.0},
                )
            )
        ranked = [study.trials[1], study.trials[0]]
        ranking = order_by_measurement(context, ranked)
        assert set(ranking.order) == {"uniform bfloat16", "float32"}  # a warm start: its label
        assert all(MIN_ROUNDS <= len(f) <= MAX_ROUNDS for f in ranking.rounds.values())
        assert all(seconds > 0 for seconds in ranking.fastest.values())
        assert {t.number for t in ranking.trials} == {0, 1}
        assert ranking.trials[0].number == {"uniform bfloat16": 1, "float32": 0}[ranking.order[0]]
        assert ranking.verdict.leader == ranking.order[0]
        assert ranking.to_dict()["verdict"] in ("separated", "tie")
        chosen = ranking.trials[0]
        timing = chosen_step_timing(context, chosen, context.trial_plan(chosen), ranking)
        assert timing.plan_seconds == ranking.fastest[ranking.order[0]]  # not timed again
        assert timing.speedup == pytest.approx(ranking.fastest["float32"] / timing.plan_seconds)


def test_confirm_plan_keeps_float32_and_skips_what_needs_no_confirmation():
    with prepared_search() as prepared:
        context = prepared.context
        float32 = _trial(0, 1.0, TrialRecord(assignment=context.uniform_assignment("float32")))
        confirmation = confirm_plan(context, [float32], None, None, 32, None)
        assert confirmation.chosen is float32
        assert confirmation.record == {"run": False, "reasons": ["float32 chosen"]}
        assert confirm_plan(context, [], None, None, 32, None).chosen is None
        mixed = _trial(3, 1.0, TrialRecord(assignment=context.uniform_assignment("bfloat16")))
        never = confirm_plan(context, [mixed], None, None, 32, 0)  # confirm_steps=0: never
        assert never.chosen is mixed and never.record["run"] is False
        assert any("low fidelity" in reason for reason in never.record["reasons"])


def test_a_plan_that_misses_the_budget_trained_longer_gives_way_to_the_next():
    keras.utils.set_random_seed(0)
    budget = Budget("val_mae", max_relative_drop=0.35)  # loose enough for 2 steps, not for 8
    with prepared_search(far_regression(), far_targets(), budget, proxy_batches=1) as prepared:
        context = prepared.context
        uniform = context.uniform_assignment("bfloat16")
        safe_head = {**uniform, "head": "float32"}
        ranked = [
            _trial(1, 1.0, TrialRecord(warm_start="uniform bfloat16", assignment=uniform)),
            _trial(2, 1.1, TrialRecord(neighbour="head -> float32", assignment=safe_head)),
        ]
        train = far_targets()[0]
        confirmation = confirm_plan(context, ranked, None, train, 32, 8)
        record = confirmation.record
        assert record["run"] and record["train_steps"] == 8
        first, second = record["attempts"]
        assert first["label"] == "uniform bfloat16" and not first["held"]
        assert second["label"] == "head -> float32" and second["held"]
        assert record["result"] == "fell back" and record["chosen_trial"] == 2
        assert confirmation.chosen.number == 2
        assert len(prepared.evaluator.train_batches) == 2  # the search's batches are back


@pytest.mark.parametrize(
    ("rounds", "expected"),
    [
        # A clear win in both the median and the fastest round: the searched plan leads.
        ({"searched": [0.80, 0.81, 0.82], "float32": [0.90, 0.95, 0.97]}, ["searched", "float32"]),
        # Split decision (the searched plan wins the median, float32 the fastest round): simpler.
        ({"searched": [0.90, 1.00, 1.20], "float32": [0.89, 1.05, 1.10]}, ["float32", "searched"]),
        # A plan beaten in both by the searched plan does not win a split decision with a third.
        (
            {"searched": [0.375, 0.46, 0.47], "float32": [0.437, 0.47, 0.48],
             "uniform bfloat16": [0.44, 0.45, 0.46]},
            ["uniform bfloat16", "searched", "float32"],
        ),
        # The fastest median leads even over a simpler plan that is slower in both.
        (
            {"heuristic": [0.50, 0.52, 0.60], "uniform bfloat16": [0.55, 0.56, 0.58],
             "float32": [0.70, 0.71, 0.72]},
            ["heuristic", "uniform bfloat16", "float32"],
        ),
        # The simplest of several tied plans goes first.
        (
            {"searched": [0.40, 0.41], "heuristic": [0.39, 0.43], "uniform bfloat16": [0.38, 0.44]},
            ["uniform bfloat16", "heuristic", "searched"],
        ),
    ],
)  # fmt: skip
def test_measured_ranking_goes_by_median_and_gives_split_decisions_to_the_simpler_plan(
    rounds, expected
):
    assert measured_ranking(rounds) == expected


def test_a_leader_ahead_beyond_the_noise_is_separated_and_needs_no_more_rounds():
    rounds = {
        "searched": [0.100, 0.102, 0.099, 0.101, 0.100],
        "float32": [0.120, 0.123, 0.118, 0.121, 0.122],
        "uniform bfloat16": [0.110, 0.112, 0.109, 0.111, 0.113],
    }
    verdict = judge_rounds(rounds, simplicity)
    assert verdict.decided and verdict.verdict == "separated"
    assert verdict.leader == verdict.fastest == "searched"
    assert verdict.contenders == ("searched",)
    assert verdict.order == ("searched", "uniform bfloat16", "float32")
    assert verdict.comparisons["float32"].margin == pytest.approx(0.020)  # paired rounds
    assert all(c.separated and c.rounds == 5 for c in verdict.comparisons.values())
    assert not wants_more_rounds(verdict)


def test_a_gain_inside_the_noise_is_a_tie_that_asks_for_rounds_then_goes_to_the_simpler_plan():
    # The searched plan's median is 2 % faster, but its rounds swing by 10 %.
    searched = [0.100, 0.112, 0.095, 0.108, 0.098]
    rounds = {"searched": searched, "float32": [0.104, 0.100, 0.111, 0.098, 0.106]}
    verdict = judge_rounds(rounds, simplicity)
    assert verdict.fastest == "searched" and not verdict.decided
    assert verdict.verdict == "tie" and set(verdict.contenders) == {"searched", "float32"}
    assert verdict.leader == "float32" and verdict.order == ("float32", "searched")
    assert wants_more_rounds(verdict)  # undecided after the first 5 rounds
    capped = {name: figures * 3 for name, figures in rounds.items()}  # MAX_ROUNDS rounds
    assert len(capped["searched"]) == MAX_ROUNDS
    final = judge_rounds(capped, simplicity)
    assert not final.decided and not wants_more_rounds(final)  # a tie at the cap
    assert final.leader == "float32"


def test_a_slower_mixed_plan_that_won_noisy_rounds_is_not_kept():
    # DenseNet121's case: the searched plan measured 197.4 ms against float32's 186.5 ms.
    rounds = {
        "searched": [0.1974, 0.1890, 0.2050, 0.1801, 0.1985],
        "float32": [0.1865, 0.1952, 0.1830, 0.1921, 0.1862],
    }
    assert measured_ranking(rounds) == ["float32", "searched"]
    more = {
        "searched": rounds["searched"] + [0.1972, 0.1969, 0.1980, 0.1975, 0.1971],
        "float32": rounds["float32"] + [0.1866, 0.1861, 0.1870, 0.1864, 0.1868],
    }
    verdict = judge_rounds(more, simplicity)
    assert verdict.decided and verdict.leader == "float32"
    assert verdict.comparisons["searched"].separated


def test_plans_timed_in_more_rounds_are_compared_over_the_rounds_both_have():
    comparison = margin_of([1.0, 1.0, 1.0, 0.5, 0.5], [1.2, 1.2, 1.2])
    assert comparison.rounds == 3 and comparison.margin == pytest.approx(0.2)
    floor = margin_of([1.0, 1.0, 1.0], [1.005, 1.005, 1.005])
    assert floor.noise == pytest.approx(NOISE_FLOOR) and not floor.separated
    with pytest.raises(ValueError, match="'float32' has none"):
        judge_rounds({"searched": [1.0], "float32": []}, simplicity)


def test_a_tie_of_every_finalist_goes_float32_keras_uniform_heuristic_dropped_searched():
    same = [1.00, 1.01, 0.99, 1.00, 1.02]
    names = ["searched", "no float32 softmax", "heuristic", "keras mixed_bfloat16", "float32"]
    rounds = {name: [value + 0.001 * index for value in same] for index, name in enumerate(names)}
    assert measured_ranking(rounds)[:2] == ["float32", "keras mixed_bfloat16"]
    assert measured_ranking(rounds)[2:] == ["heuristic", "no float32 softmax", "searched"]
    without = {name: figures for name, figures in rounds.items() if name != "float32"}
    with_uniform = {**without, "uniform bfloat16": [v + 0.002 for v in same]}
    # Keras' global policy and a uniform plan are as simple: the faster median goes first.
    assert measured_ranking(with_uniform)[:2] == ["uniform bfloat16", "keras mixed_bfloat16"]


def test_the_verdict_line_names_the_winner_and_its_margin_or_the_tie(ranked):
    clear = {"searched": [0.50, 0.51, 0.50], "float32": [1.00, 1.01, 1.00]}
    won = verdict_line(rank_by_measurement(ranked, _timed(ranked), clear))
    assert "searched leads, 500 ms median against float32's 1000 ms (2x)" in won
    assert "next float32, slower by 500 ms" in won and "3 interleaved rounds, 2 plans" in won
    tied = {"searched": [0.99, 1.02, 0.98], "float32": [1.00, 0.99, 1.01]}
    ranking = rank_by_measurement(ranked, _timed(ranked), tied)
    line = verdict_line(ranking)
    assert "a tie within the noise" in line and "using the simpler float32" in line
    assert ranking.trials[0].number == 0 and ranking.replaced_by == "float32"
    record = ranking.to_dict()
    assert record["verdict"] == "tie" and record["leader"] == "float32"
    assert record["rounds"]["searched"] == tied["searched"]
    assert record["trials"] == {"searched": 5, "float32": 0}
    assert set(record["against_fastest"]) == {"float32"}  # the fastest is the searched plan


def test_more_rounds_never_take_a_plan_past_the_cap():
    # A plan that left the tie and rejoined it has fewer rounds than the others.
    rounds = {"a": [1.0] * 10, "b": [1.0] * 5, "c": [1.0] * 15}
    assert next_rounds(rounds, ["a", "b", "c"], min_rounds=5, max_rounds=15) == (["a", "b"], 5)
    rounds = {"a": [1.0] * 12, "b": [1.0] * 5}
    names, batch = next_rounds(rounds, ["a", "b"], min_rounds=5, max_rounds=15)
    assert names == ["a", "b"] and batch == 3 and 12 + batch <= 15
    assert next_rounds({"a": [1.0] * 15, "b": [1.0] * 15}, ["a", "b"]) == ([], 0)
