"""Tests for `autoprec.search.selection`: finalists, the measured ranking, the confirmation and the result."""

from __future__ import annotations

import copy
import logging
import random

import keras
import numpy as np
import optuna
import pytest
from search.search_models import (
    attention_classifier,
    compiled_mlp,
    far_regression,
    far_targets,
    labelled,
    mlp_data,
    prepared_search,
)

import autoprec
from autoprec._core.timing import (
    MAX_ROUNDS,
    MIN_ROUNDS,
    NOISE_FLOOR,
    judge_rounds,
    margin_of,
    next_rounds,
    wants_more_rounds,
)
from autoprec.layers import describe_model, model_fingerprint
from autoprec.plan import PrecisionPlan
from autoprec.search import Budget, SearchResult, TrialRecord, compute_layers, output_layers
from autoprec.search.driver import run_trials
from autoprec.search.result import (
    DROPPED_PREFIX,
    HEURISTIC,
    KERAS_PREFIX,
    PROTECTION_KINDS,
    SEARCHED,
    UNIFORM_PREFIX,
    assignment_key,
    dropped_label,
    keras_dtype,
    keras_label,
    measurement_text,
    plan_default,
    simplicity,
)
from autoprec.search.selection import (
    MeasuredRanking,
    add_finalists,
    choose_plan,
    chosen_step_timing,
    confirm_plan,
    dropped_protection,
    finalist_key,
    finalist_plan,
    fits_profile,
    keras_global_plan,
    measurement_candidates,
    order_by_measurement,
    protections,
    rank_by_measurement,
    rank_trials,
    ranked_finalists,
    sixteen_bit_dtype,
)
from autoprec.search.space import plan_from_assignment
from autoprec.search.study import WarmStart, enqueue_candidates


def _study(context, entries):
    study = optuna.create_study()
    for dtype, value, violation in entries:
        assignment = context.uniform_assignment(dtype)
        record = TrialRecord(
            warm_start=f"uniform {dtype}", assignment=assignment, predicted_seconds=value
        )
        study.add_trial(
            optuna.trial.create_trial(
                value=value, user_attrs=record.to_user_attrs(), constraints={"budget": violation}
            )
        )
    return study


def test_the_ranking_is_one_trial_per_assignment_within_budget_cheapest_first():
    with prepared_search(measure_speedup=False) as prepared:
        context = prepared.context
        study = _study(
            context,
            [("float32", 2.0, -1.0), ("bfloat16", 1.0, -1.0), ("bfloat16", 1.0, -1.0),
             ("bfloat16", 0.5, 1.0)],
        )  # fmt: skip
        context.study = study
        ranked = rank_trials(context)
        assert context.measured is None and not context.measure
        assert [t.number for t in ranked] == [1, 0] and context.ranked == ranked
        result = choose_plan(context)
        search = result.plan.metadata["search"]
        assert search["best_trial"] == 1 and result.plan.metadata["measured_speedup"] is None
        assert "replaced_by_measurement" not in search and "measured_step_seconds" not in search
        assert set(result.plan.layers.values()) == {"bfloat16"}


def test_nothing_within_budget_returns_float32(caplog):
    with prepared_search(measure_speedup=False) as prepared:
        study = _study(prepared.context, [("bfloat16", 1.0, 1.0)])
        prepared.context.study = study
        assert rank_trials(prepared.context) == [] and "no plan met the budget" in caplog.text
        result = choose_plan(prepared.context)
        assert "best_trial" not in result.plan.metadata["search"]
        assert set(result.plan.layers.values()) == {"float32"}


def test_the_result_carries_the_chosen_plan_and_its_metadata(tmp_path):
    path = tmp_path / "plan.json"
    with prepared_search(measure_speedup=False, confirm_steps=0, plan_path=path) as prepared:
        context = prepared.context
        run_trials(context)
        ranked = rank_trials(context)
        result = choose_plan(context)
        assert isinstance(result, SearchResult) and result.study is context.study
        metadata = result.plan.metadata
        search = metadata["search"]
        assert search["best_trial"] == ranked[0].number and search["trials"] == 2
        assert search["confirmation"]["run"] is False
        assert set(search["warm_starts"]) >= {"float32", "uniform bfloat16"}
        assert set(search["stage_seconds"]) >= {"costs", "trials", "confirmation"}
        assert metadata["measured_speedup"] is None
        assert set(metadata["evidence"]) == set(context.compute)
        assert path.exists() and result.points


def test_a_measured_choice_records_its_step_times():
    with prepared_search(hardware="local", confirm_steps=0) as prepared:
        context = prepared.context
        context.n_trials = 2
        run_trials(context)
        rank_trials(context)
        measured = context.measured
        assert context.measure and measured is not None
        result = choose_plan(context)
        search = result.plan.metadata["search"]
        plan_seconds = search["measured_plan_step_seconds"]
        assert plan_seconds == measured.fastest[measured.order[0]]  # not timed again
        assert set(search["measured_step_rounds"]) == set(measured.order)
        recorded = search["measurement"]
        assert recorded["verdict"] in ("separated", "tie")
        assert recorded["leader"] == measured.order[0]
        assert set(recorded["median_seconds"]) == set(measured.order)
        speedup = search["measured_float32_step_seconds"] / plan_seconds
        assert result.plan.metadata["measured_speedup"] == speedup


def _feasible(study, context, label, assignment, value):
    record = TrialRecord(
        warm_start=label,
        assignment=context.normalise(assignment),
        assignment_key=assignment_key(context.normalise(assignment)),
        train_steps=context.train_steps,
        predicted_seconds=value,
        metrics={"accuracy": 1.0},
        metric=1.0,
        budget_violation=-1.0,
    )
    study.add_trial(
        optuna.trial.create_trial(
            value=value, user_attrs=record.to_user_attrs(), constraints={"budget": -1.0}
        )
    )
    return study.trials[-1]


def test_finalists_are_keras_global_policies_and_protections_the_profile_lets_go():
    model = attention_classifier()
    train, val = labelled(model, 256)
    prof = autoprec.profile(model, train, steps=2, batch_size=32, verbose=0)
    with prepared_search(model, (train, val), profile=prof, cost_batch_size=4096) as prepared:
        context = prepared.context
        protected = {
            **context.uniform_assignment("bfloat16"),
            "attention/softmax": "float32",
            "norm": "float32",
            "head": "float32",
        }
        study = optuna.create_study()
        base = _feasible(study, context, "heuristic", protected, 1e-9)  # the cheapest plan
        context.study = study
        finalists = add_finalists(context)
        assert finalists["base_trial"] == base.number
        labels = {"no float32 softmax", "no float32 normalisation", "no float32 outputs"}
        assert {"keras mixed_bfloat16", *labels} <= set(finalists["trials"])
        trials = {label: study.trials[number] for label, number in finalists["trials"].items()}
        keras_trial = trials["keras mixed_bfloat16"]
        record = TrialRecord.from_trial(keras_trial)
        assert keras_trial.state == optuna.trial.TrialState.COMPLETE and record.fidelity
        assert record.metric is not None and "budget" in keras_trial.constraints
        exact = finalist_plan(context, keras_trial)
        assert exact.layers == PrecisionPlan.uniform(model, "bfloat16").layers
        assert set(exact.resolve().values()) == {"bfloat16"}
        for kind, path in (("softmax", "attention/softmax"), ("normalisation", "norm")):
            dropped = TrialRecord.from_trial(trials[f"no float32 {kind}"])
            assert dropped.assignment == {**protected, path: "bfloat16"}
            assert dropped.metrics is not None  # trained and held to the budget like any trial
        again = add_finalists(context)  # a resumed study
        assert again["trials"] == finalists["trials"] and len(study.trials) == len(trials) + 1
        ranked = ranked_finalists(context, study)
        plans = {finalist_key(context, trial) for trial in ranked}
        assert len(plans) == len(ranked) and keras_trial.number in {t.number for t in ranked}


def test_without_a_profile_no_protection_is_dropped_and_keras_is_a_trial_s_plan():
    with prepared_search(cost_batch_size=4096) as prepared:  # bfloat16 only: no profile
        context = prepared.context
        assert context.profile is None
        study = optuna.create_study()
        uniform = _feasible(
            study, context, "uniform bfloat16", context.uniform_assignment("bfloat16"), 1.0
        )
        context.study = study
        finalists = add_finalists(context)
        # The MLP has no container: Keras' mixed_bfloat16 is the uniform plan, not trained again.
        assert finalists["trials"] == {"keras mixed_bfloat16": uniform.number}
        assert finalists["same_as"] == {"keras mixed_bfloat16": "uniform bfloat16"}
        assert len(study.trials) == 1
        reasons = {
            finalists["skipped"][f"no float32 {kind}"] for kind in ("normalisation", "outputs")
        }
        assert reasons == {"no profile to show the ranges fit"}


def test_a_search_returns_float32_when_float32_measures_fastest():
    with prepared_search(hardware="local", confirm_steps=0) as prepared:
        context = prepared.context
        run_trials(context)
        finalists = add_finalists(context)
        ranked = ranked_finalists(context, context.study)
        candidates = measurement_candidates(context, ranked)
        trials = {name: trial for name, (_, trial) in candidates.items()}
        assert next(iter(trials.values())).number == ranked[0].number  # the best first
        assert {"float32", "keras mixed_bfloat16"} <= set(candidates) | set(finalists["same_as"])
        rounds = {  # float32 fastest beyond the noise in every round
            name: [0.5 + 0.001 * i if name == "float32" else 1.0 + 0.001 * i for i in range(5)]
            for name in candidates
        }
        measured = rank_by_measurement(ranked, trials, rounds)
        context.ranked, context.measured, context.measure = list(measured.trials), measured, True
        result = choose_plan(context)
        assert set(result.plan.resolve().values()) == {"float32"}
        search = result.plan.metadata["search"]
        assert search["measurement"]["leader"] == "float32"
        assert search["measurement"]["verdict"] == "separated"
        assert search["measurement"]["rounds"]["float32"] == rounds["float32"]
        assert search["finalists"] == finalists
        assert result.plan.metadata["measured_speedup"] == 1.0
        assert "float32 at 502 ms median, ahead of every other plan beyond the noise" in (
            result.report()
        )


def test_a_keras_global_policy_its_output_floor_refuses_is_recorded_untrained():
    budget = Budget("val_mae", max_relative_drop=0.1)  # a bfloat16 head cannot resolve 1000
    with prepared_search(far_regression(), far_targets(), budget, proxy_batches=1) as prepared:
        context = prepared.context
        study = optuna.create_study()
        context.study = study
        finalists = add_finalists(context)
        trial = study.trials[finalists["trials"]["keras mixed_bfloat16"]]
        record = TrialRecord.from_trial(trial)
        assert trial.state == optuna.trial.TrialState.COMPLETE
        assert record.fidelity == ("profile", "floor") and record.metrics is None
        assert trial.constraints["output_floor"] > 0 and "budget" not in trial.constraints
        assert trial.user_attrs["output_floor"]["refused"]
        assert ranked_finalists(context, study) == []  # never timed, ranked or returned


KERAS_BF16 = keras_label("bfloat16")
KERAS_F16 = keras_label("float16")


def _tiny_attention() -> keras.Model:
    """A one-head `MultiHeadAttention` container, a pooling layer and a softmax head."""
    inputs = keras.Input((4, 8))
    attended = keras.layers.MultiHeadAttention(num_heads=1, key_dim=4, name="attention")(
        inputs, inputs
    )
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(attended)
    outputs = keras.layers.Dense(2, activation="softmax", name="head")(pooled)
    model = keras.Model(inputs, outputs, name="tiny_attention")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _count_trainings(monkeypatch, context, fail: bool = False) -> list:
    """Records each plan the context's evaluator trains (raising instead where `fail`)."""
    evaluator = context.evaluator
    original = evaluator.train_and_evaluate
    trained = []

    def train_and_evaluate(plan, *args, **kwargs):
        trained.append(plan)
        if fail:
            raise RuntimeError("out of memory for this plan")
        return original(plan, *args, **kwargs)

    monkeypatch.setattr(evaluator, "train_and_evaluate", train_and_evaluate)
    return trained


def _completed(study, context, label, assignment, value, violation=-1.0, train_steps=None):
    """Adds a completed, trained trial of `assignment` to `study` and returns it."""
    record = TrialRecord(
        warm_start=label,
        assignment=dict(assignment),
        assignment_key=assignment_key(assignment),
        train_steps=context.train_steps if train_steps is None else train_steps,
        predicted_seconds=value,
        fidelity=("profile", "train"),
        metrics={"val_accuracy": 1.0},
        metric=1.0,
        budget_violation=violation,
    )
    study.add_trial(
        optuna.trial.create_trial(
            value=value, user_attrs=record.to_user_attrs(), constraints={"budget": violation}
        )
    )
    return study.trials[-1]


def test_keras_global_policy_with_a_container_is_trained_once_and_judged_by_the_budget(
    monkeypatch,
):
    model = _tiny_attention()
    with prepared_search(model, labelled(model, 96, classes=2)) as prepared:
        context = prepared.context
        assert context.dtypes == ("float32", "bfloat16")
        trained = _count_trainings(monkeypatch, context)
        study = optuna.create_study()
        context.study = study
        finalists = add_finalists(context)

        expected = keras_global_plan(context, "bfloat16")
        assert len(trained) == 1 and trained[0].layers == expected.layers
        assert finalists["same_as"] == {}
        assert set(finalists["trials"]) == {KERAS_BF16}  # no float16: not among the dtypes
        trial = study.trials[finalists["trials"][KERAS_BF16]]
        record = TrialRecord.from_trial(trial)
        assert trial.state == optuna.trial.TrialState.COMPLETE
        assert record.warm_start == KERAS_BF16 and record.fidelity == ("profile", "train")
        assert record.assignment == dict(expected.layers) and "attention" in record.assignment
        assert record.assignment_key == assignment_key(expected.layers)
        assert record.train_steps == context.train_steps
        counted = {dtype: count for dtype, count in record.dtype_counts.items() if count}
        assert counted == {"bfloat16": len(context.compute)}  # counted on the compute layers
        # Judged as the objective judges a trial: the budget on the trained metric.
        assert record.metric == record.metrics[context.budget.log_name]
        violation = context.budget.violation(context.reference, record.metric)
        assert record.budget_violation == trial.constraints["budget"] == violation
        assert "output_floor" in trial.constraints  # the output rounding floor was judged too
        assert trial.value == pytest.approx(record.predicted_seconds)  # no trial of its compute
        assert finalist_plan(context, trial).layers == expected.layers
        # The only plan, within budget: the protections are dropped from it, but there is no
        # profile (bfloat16 only) to show their ranges fit.
        assert ranked_finalists(context, study) == ([trial] if violation <= 0 else [])
        assert finalists["base_trial"] == (trial.number if violation <= 0 else None)
        assert finalists["trials"] == {KERAS_BF16: trial.number} and context.finalists == finalists

        again = add_finalists(context)  # a resumed study
        assert again == finalists and again["same_as"] == {}  # found as itself, not as a copy
        assert len(study.trials) == 1
        assert len(trained) == 1  # not trained twice


def test_a_keras_policy_outside_the_budget_is_added_but_never_a_base(monkeypatch):
    with prepared_search() as prepared:
        # A float32 reference of 2.0 accuracy: within a 0.5 drop, no plan meets the budget.
        context = copy.copy(prepared.context)
        context.reference = 2.0
        trained = _count_trainings(monkeypatch, context)
        study = optuna.create_study()
        uniform = context.uniform_assignment("bfloat16")
        # The same compute plan, but trained for another number of steps: it does not count.
        other = _completed(
            study, context, "uniform bfloat16", uniform, 1.0, train_steps=context.train_steps + 1
        )
        context.study = study
        finalists = add_finalists(context)
        assert len(trained) == 1 and len(study.trials) == 2
        number = finalists["trials"][KERAS_BF16]
        assert number != other.number and finalists["same_as"] == {}
        trial = study.trials[number]
        record = TrialRecord.from_trial(trial)
        assert trial.state == optuna.trial.TrialState.COMPLETE and record.metric is not None
        assert trial.constraints["budget"] == pytest.approx(context.reference - 0.5 - record.metric)
        assert trial.constraints["budget"] > 0 and record.budget_violation > 0
        # The compute plan is the other trial's: its objective value stands for this one.
        assert trial.value == other.value
        assert [t.number for t in ranked_finalists(context, study)] == [other.number]
        assert finalists["base_trial"] == other.number  # the only one within budget


def test_a_keras_policy_a_trial_already_ran_is_that_trial_and_not_trained_again(monkeypatch):
    with prepared_search() as prepared:
        context = prepared.context
        run_trials(context)
        records = {TrialRecord.from_trial(t).warm_start: t for t in context.study.trials}
        assert {"float32", "uniform bfloat16"} <= set(records)
        trained = _count_trainings(monkeypatch, context)
        before = len(context.study.trials)
        finalists = add_finalists(context)
        # The MLP has no container: Keras' mixed_bfloat16 is the uniform bfloat16 plan.
        assert finalists["trials"][KERAS_BF16] == records["uniform bfloat16"].number
        assert finalists["same_as"] == {KERAS_BF16: "uniform bfloat16"}
        assert trained == [] and len(context.study.trials) == before

        # A trial without a warm start label stands for it too, named by its number.
        study = optuna.create_study()
        _completed(study, context, "float32", context.uniform_assignment("float32"), 2.0)
        plain = _completed(study, context, None, context.uniform_assignment("bfloat16"), 1.0)
        context.study = study
        again = add_finalists(context)
        assert again["trials"][KERAS_BF16] == plain.number
        assert again["same_as"] == {KERAS_BF16: f"trial {plain.number}"}
        assert trained == [] and len(study.trials) == 2


def test_a_keras_policy_that_fails_to_train_is_skipped_with_the_reason(monkeypatch, caplog):
    with prepared_search(cost_batch_size=4096) as prepared:
        context = prepared.context
        context.dtypes = ("float32", "bfloat16", "float16")
        trained = _count_trainings(monkeypatch, context, fail=True)
        study = optuna.create_study()
        with caplog.at_level(logging.WARNING, logger="autoprec"):
            context.study = study
            finalists = add_finalists(context)
        # float16 among the dtypes: mixed_float16 is a finalist too.
        assert [plan.layers for plan in trained] == [
            keras_global_plan(context, dtype).layers for dtype in ("bfloat16", "float16")
        ]
        assert finalists["trials"] == {} and study.trials == []
        for label in (KERAS_BF16, KERAS_F16):
            assert finalists["skipped"][label] == (
                "training failed: RuntimeError: out of memory for this plan"
            )
            assert f"{label} could not be trained" in caplog.text
        assert finalists["skipped"]["protections"] == "no plan within budget"
        assert finalists["base_trial"] is None


def test_the_best_plan_with_a_protection_dropped_runs_through_the_trial_objective():
    model = compiled_mlp()
    train, val = mlp_data()
    prof = autoprec.profile(model, train, steps=2, batch_size=32, verbose=0)
    with prepared_search(model, (train, val), profile=prof) as prepared:
        context = prepared.context
        (head,) = sorted(context.outputs)
        assert context.profile is prof and prof.layers[head].bfloat16_safe
        first = context.compute[0]
        protected = {**context.uniform_assignment("float32"), first: "bfloat16"}
        study = optuna.create_study()
        base = _completed(study, context, "heuristic", protected, 1e-9)  # the cheapest
        uniform = _completed(
            study, context, "uniform bfloat16", context.uniform_assignment("bfloat16"), 1.0
        )
        ahead = context.normalise(
            {path: "float32" for path in context.compute} | {head: "bfloat16"}
        )
        (ahead_key,) = enqueue_candidates(
            study, [WarmStart("queued before", ahead, context.params_for(ahead))]
        )
        context.study = study
        finalists = add_finalists(context)

        assert finalists["base_trial"] == base.number
        assert finalists["trials"][KERAS_BF16] == uniform.number  # no container: that trial
        label = dropped_label("outputs")
        dropped = study.trials[finalists["trials"][label]]
        record = TrialRecord.from_trial(dropped)
        assert record.warm_start == label
        assert record.assignment == {**protected, head: "bfloat16"}
        assert dropped.state == optuna.trial.TrialState.COMPLETE
        assert record.metrics is not None and "budget" in dropped.constraints  # trained, judged
        assert finalists["skipped"][dropped_label("softmax")] == "no softmax layer kept in float32"
        assert finalists["skipped"][dropped_label("normalisation")] == (
            "no normalisation layer kept in float32"
        )
        # The trial queued before it ran first (Optuna's queue is first in, first out).
        (queued,) = [
            t for t in study.trials if TrialRecord.from_trial(t).assignment_key == ahead_key
        ]
        assert queued.state.is_finished() and queued.number < dropped.number
        assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))


# ------------------------------------------------------------------ labels and order


def test_keras_labels_name_keras_policies_and_give_back_their_dtype():
    assert keras_label("bfloat16") == "keras mixed_bfloat16"
    assert keras_label("float16") == "keras mixed_float16"
    assert keras_label("float8") == "keras float8_from_mixed_bfloat16"
    for dtype in ("bfloat16", "float16", "float8"):
        assert keras_label(dtype).startswith(KERAS_PREFIX)
        assert keras_dtype(keras_label(dtype)) == dtype
    others = [None, "", HEURISTIC, SEARCHED, "float32", "uniform bfloat16", "keras float32"]
    others += ["keras mixed_bfloat16 ", "mixed_bfloat16", dropped_label("softmax")]
    for other in others:
        assert keras_dtype(other) is None, other


def test_a_keras_global_plan_s_default_is_its_dtype_or_bfloat16_for_float8():
    assert plan_default("bfloat16") == "bfloat16"
    assert plan_default("float16") == "float16"
    assert plan_default("float8") == "bfloat16"  # float8's source policy


def test_dropped_labels_name_each_protection_kind():
    assert PROTECTION_KINDS == ("softmax", "normalisation", "outputs")
    assert [dropped_label(kind) for kind in PROTECTION_KINDS] == [
        "no float32 softmax",
        "no float32 normalisation",
        "no float32 outputs",
    ]
    assert all(dropped_label(kind).startswith(DROPPED_PREFIX) for kind in PROTECTION_KINDS)


def test_simplicity_orders_float32_keras_uniform_heuristic_dropped_searched():
    expected = [
        ["float32"],
        [
            keras_label("bfloat16"),
            keras_label("float16"),
            keras_label("float8"),
            f"{UNIFORM_PREFIX}bfloat16",
            f"{UNIFORM_PREFIX}float16",
        ],
        [HEURISTIC],
        [dropped_label(kind) for kind in PROTECTION_KINDS],
        [SEARCHED, "trial 7", "per-layer", "float32 and more"],  # anything else: searched
    ]
    for rank, names in enumerate(expected):
        assert {simplicity(name) for name in names} == {rank}, names
    shuffled = [name for names in expected for name in names]
    random.Random(0).shuffle(shuffled)
    ordered = sorted(shuffled, key=simplicity)
    assert [simplicity(name) for name in ordered] == sorted(simplicity(n) for n in shuffled)
    assert ordered[0] == "float32" and set(ordered[-4:]) == set(expected[-1])


def test_the_sixteen_bit_dtype_is_the_majority_bfloat16_among_equals():
    assert sixteen_bit_dtype({}) is None
    assert sixteen_bit_dtype({"a": "float32", "b": "float32"}) is None
    assert sixteen_bit_dtype({"a": "float8", "b": "float32"}) is None  # float8 is not 16-bit
    assert sixteen_bit_dtype({"a": "float16", "b": "float32"}) == "float16"
    assert sixteen_bit_dtype({"a": "float16", "b": "float16", "c": "bfloat16"}) == "float16"
    assert sixteen_bit_dtype({"a": "float16", "b": "bfloat16", "c": "float32"}) == "bfloat16"
    assert sixteen_bit_dtype({"a": "bfloat16", "b": "float8", "c": "float8"}) == "bfloat16"


# ------------------------------------------------------------------ protections and the profile


def _two_heads() -> keras.Model:
    """A Softmax head after a BatchNormalization, and a head near 1e5 after a LayerNormalization."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,))
    wide = keras.layers.Dense(32, activation="relu", name="wide")(inputs)
    normalised = keras.layers.BatchNormalization(name="batch_norm")(wide)
    logits = keras.layers.Dense(4, name="logits")(normalised)
    probs = keras.layers.Softmax(name="probs")(logits)
    far = keras.layers.Dense(1, name="far", bias_initializer=keras.initializers.Constant(1e5))(
        keras.layers.LayerNormalization(name="norm")(wide)
    )
    model = keras.Model(inputs, [probs, far], name="two_heads")
    model.compile(optimizer="adam", loss=["sparse_categorical_crossentropy", "mse"])
    return model


@pytest.fixture(scope="module")
def profiled():
    """`(profile, infos, compute, outputs)` of `_two_heads`, profiled for two real steps."""
    model = _two_heads()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 16)).astype("float32")
    y = (
        rng.integers(0, 4, size=(64,)).astype("int32"),
        (1e5 + rng.normal(size=(64, 1))).astype("float32"),
    )
    prof = autoprec.profile(model, (x, y), steps=2, batch_size=32, verbose=0)
    infos = describe_model(model)
    compute = compute_layers(infos)
    return prof, infos, compute, sorted(output_layers(model, infos))


def test_protections_are_the_softmax_normalisation_and_output_layers_in_model_order(profiled):
    _, infos, compute, outputs = profiled
    assert compute == ["wide", "batch_norm", "logits", "norm", "probs", "far"]
    kinds = protections(compute, infos, outputs)
    assert list(kinds) == list(PROTECTION_KINDS)
    assert kinds == {
        "softmax": ("probs",),
        "normalisation": ("batch_norm", "norm"),
        "outputs": ("probs", "far"),
    }
    # No output named: that kind is empty, the others are the same.
    assert protections(compute, infos, [])["outputs"] == ()
    assert protections(["wide", "logits"], infos, outputs) == dict.fromkeys(PROTECTION_KINDS, ())


def test_fits_profile_reads_the_layer_or_its_nearest_recorded_container(profiled):
    prof = profiled[0]
    for path, layer in prof.layers.items():
        assert fits_profile(prof, path, "float16") == layer.float16_safe
        assert fits_profile(prof, path, "bfloat16") == layer.bfloat16_safe
    # The head near 1e5 is above float16's 65504, inside bfloat16's range.
    assert not fits_profile(prof, "far", "float16") and fits_profile(prof, "far", "bfloat16")
    assert fits_profile(prof, "probs", "float16") and fits_profile(prof, "norm", "float16")
    assert not fits_profile(prof, "far/inner", "float16")  # judged by `far`
    assert fits_profile(prof, "far/inner/deeper", "bfloat16")
    assert not fits_profile(prof, "missing", "bfloat16")
    assert not fits_profile(prof, "missing/far", "bfloat16")  # no container recorded
    assert not fits_profile(None, "probs", "bfloat16")


def test_dropping_a_protection_moves_its_float32_layers_to_the_plan_s_16_bit_dtype(profiled):
    prof, infos, compute, outputs = profiled
    kinds = protections(compute, infos, outputs)
    allowed = {path: ("float32", "bfloat16", "float16") for path in compute}
    protected = {"batch_norm": "float32", "norm": "float32", "probs": "float32", "far": "float32"}
    for dtype in ("bfloat16", "float16"):
        plan = {"wide": dtype, "logits": dtype, **protected}
        before = dict(plan)
        plans, skipped = dropped_protection(plan, kinds, allowed, prof)
        assert plan == before  # the plan given is left as it was
        assert plans[dropped_label("softmax")] == {**plan, "probs": dtype}
        assert plans[dropped_label("normalisation")] == {**plan, "batch_norm": dtype, "norm": dtype}
        if dtype == "bfloat16":
            assert plans[dropped_label("outputs")] == {**plan, "probs": dtype, "far": dtype}
        else:  # `far` does not fit float16: only the softmax head moves
            assert plans[dropped_label("outputs")] == {**plan, "probs": dtype}
        assert skipped == {}
    # The majority 16-bit dtype is the one the protections move to.
    mixed = {**protected, "wide": "float16", "logits": "float16", "batch_norm": "bfloat16"}
    plans, _ = dropped_protection(mixed, kinds, allowed, prof)
    assert plans[dropped_label("normalisation")]["norm"] == "float16"
    assert plans[dropped_label("normalisation")]["batch_norm"] == "bfloat16"  # not float32: kept


def test_a_protection_is_kept_where_no_layer_may_move_and_says_why(profiled):
    prof, infos, compute, outputs = profiled
    kinds = protections(compute, infos, outputs)
    allowed = {path: ("float32", "bfloat16", "float16") for path in compute}
    float32 = dict.fromkeys(compute, "float32")
    plans, skipped = dropped_protection(float32, kinds, allowed, prof)
    assert plans == {}
    assert skipped == {dropped_label(kind): "the plan has no 16-bit layer" for kind in kinds}
    plan = {**float32, "wide": "float16", "probs": "float16", "norm": "float16"}
    plans, skipped = dropped_protection(plan, kinds, allowed, None)
    assert plans == {}
    assert set(skipped.values()) == {"no profile to show the ranges fit"}
    plans, skipped = dropped_protection(plan, kinds, allowed, prof)
    assert skipped[dropped_label("softmax")] == "no softmax layer kept in float32"
    assert plans[dropped_label("normalisation")] == {**plan, "batch_norm": "float16"}
    assert skipped[dropped_label("outputs")] == (
        "the profile does not show the outputs ranges fit float16"
    )  # `far` is the only float32 output and overflows float16
    only_float32 = {**allowed, "batch_norm": ("float32",)}  # e.g. a keep_float32 layer
    plans, skipped = dropped_protection(plan, kinds, only_float32, prof)
    assert dropped_label("normalisation") not in plans
    assert skipped[dropped_label("normalisation")] == (
        "the profile does not show the normalisation ranges fit float16"
    )


# ------------------------------------------------------------------ Keras' global plans, finalists


def _tiny_attention() -> keras.Model:
    """A one-head `MultiHeadAttention` container, a pooling layer and a softmax head."""
    inputs = keras.Input((4, 8))
    attended = keras.layers.MultiHeadAttention(num_heads=1, key_dim=4, name="attention")(
        inputs, inputs
    )
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(attended)
    outputs = keras.layers.Dense(2, activation="softmax", name="head")(pooled)
    model = keras.Model(inputs, outputs, name="tiny_attention")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _trial(study, context, label, assignment, value, violation=-1.0):
    record = TrialRecord(
        warm_start=label,
        assignment=dict(assignment),
        assignment_key=assignment_key(assignment),
        train_steps=context.train_steps,
        predicted_seconds=value,
    )
    study.add_trial(
        optuna.trial.create_trial(
            value=value, user_attrs=record.to_user_attrs(), constraints={"budget": violation}
        )
    )
    return study.trials[-1]


def test_keras_global_plans_the_finalists_plans_keys_and_ranking_on_a_real_context():
    model = _tiny_attention()
    with prepared_search(model, labelled(model, 96, classes=2)) as prepared:
        context = prepared.context
        assert "attention" not in context.compute  # a container: no trial sets it
        fingerprint = model_fingerprint(describe_model(model))

        plan = keras_global_plan(context, "bfloat16")
        uniform = PrecisionPlan.uniform(model, "bfloat16")
        assert plan.layers == uniform.layers and plan.default == "bfloat16"
        assert plan.layers["attention"] == "bfloat16"  # the container too, as Keras does
        assert set(plan.resolve().values()) == {"bfloat16"}
        assert keras_global_plan(context, "float16").default == "float16"

        kept = keras_global_plan(context, "bfloat16", keep_float32=("head",))
        assert kept.fingerprint == fingerprint and kept.model_name == model.name
        assert kept.default == "bfloat16" and kept.layers["head"] == "float32"
        assert {path: d for path, d in kept.layers.items() if path != "head"} == {
            path: d for path, d in plan.layers.items() if path != "head"
        }

        float8 = keras_global_plan(context, "float8").resolve()
        dense = {
            path
            for path, info in context.infos.items()
            if info.class_name in ("Dense", "EinsumDense")
        }
        assert dense >= {"head", "attention/query_dense"}
        assert {float8[path] for path in dense} == {"float8"}  # the output layer included
        assert {d for path, d in float8.items() if path not in dense} == {"bfloat16"}
        kept8 = keras_global_plan(context, "float8", keep_float32=("head",))
        assert kept8.default == plan_default("float8") == "bfloat16"
        assert kept8.resolve()["head"] == "float32"
        assert kept8.resolve()["attention/query_dense"] == "float8"

        exact = plan_from_assignment(context.model, context.infos, plan.layers, "bfloat16")
        assert exact.layers == plan.layers and exact.fingerprint == fingerprint

        study = optuna.create_study()
        compute_bf16 = context.uniform_assignment("bfloat16")
        keras_trial = _trial(study, context, keras_label("bfloat16"), plan.layers, 1.0)
        uniform_trial = _trial(study, context, "uniform bfloat16", compute_bf16, 1.0)
        _trial(study, context, None, compute_bf16, 2.0)  # the same plan again, dearer
        _trial(study, context, "over budget", context.uniform_assignment("float32"), 0.5, 1.0)
        float32 = _trial(study, context, "float32", context.uniform_assignment("float32"), 3.0)

        assert finalist_plan(context, keras_trial).layers == plan.layers
        assert finalist_plan(context, uniform_trial).layers == (
            context.trial_plan(uniform_trial).layers
        )
        # The trial's plan is the search's (default float32); Keras' keeps its own default.
        assert finalist_plan(context, uniform_trial).default == "float32"
        assert finalist_plan(context, keras_trial).default == "bfloat16"
        # Keras' plan differs from the uniform trial's in its container only: apart.
        assert finalist_key(context, keras_trial) == assignment_key(plan.layers)
        assert finalist_key(context, uniform_trial) == assignment_key(compute_bf16)
        assert finalist_key(context, keras_trial) != finalist_key(context, uniform_trial)

        ranked = ranked_finalists(context, study)
        # Cheapest first, lowest number among equals, one per plan, none over budget.
        assert [t.number for t in ranked] == [
            keras_trial.number,
            uniform_trial.number,
            float32.number,
        ]


def measured_ranking(rounds):
    return list(judge_rounds(rounds, simplicity).order)


def _frozen_trial(number: int, value: float, record: TrialRecord) -> optuna.trial.FrozenTrial:
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
        _frozen_trial(5, 1.0, TrialRecord(assignment={"a": "bfloat16", "b": "float32"})),
        _frozen_trial(
            1, 2.0, TrialRecord(warm_start="uniform bfloat16", assignment={"a": "bfloat16"})
        ),
        _frozen_trial(0, 3.0, TrialRecord(warm_start="float32", assignment={"a": "float32"})),
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
    extra = _frozen_trial(7, 2.5, TrialRecord(neighbour="a -> bfloat16", assignment={"a": "x"}))
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
        assert timing["measured_plan_step_seconds"] == ranking.fastest[ranking.order[0]]
        assert timing["measured_float32_step_seconds"] == ranking.fastest["float32"]


def test_confirm_plan_keeps_float32_and_skips_what_needs_no_confirmation():
    with prepared_search() as prepared:
        context = prepared.context
        float32 = _frozen_trial(
            0, 1.0, TrialRecord(assignment=context.uniform_assignment("float32"))
        )
        chosen, record = confirm_plan(context, [float32])
        assert chosen is float32 and record == {"run": False, "reasons": ["float32 chosen"]}
        assert confirm_plan(context, [])[0] is None
        mixed = _frozen_trial(
            3, 1.0, TrialRecord(assignment=context.uniform_assignment("bfloat16"))
        )
        chosen, record = confirm_plan(context, [mixed], 0)  # confirm_steps=0: never
        assert chosen is mixed and record["run"] is False
        assert any("low fidelity" in reason for reason in record["reasons"])


def test_a_plan_that_misses_the_budget_trained_longer_gives_way_to_the_next():
    keras.utils.set_random_seed(0)
    budget = Budget("val_mae", max_relative_drop=0.35)  # loose enough for 2 steps, not for 8
    with prepared_search(far_regression(), far_targets(), budget, proxy_batches=1) as prepared:
        context = prepared.context
        uniform = context.uniform_assignment("bfloat16")
        safe_head = {**uniform, "head": "float32"}
        ranked = [
            _frozen_trial(1, 1.0, TrialRecord(warm_start="uniform bfloat16", assignment=uniform)),
            _frozen_trial(2, 1.1, TrialRecord(neighbour="head -> float32", assignment=safe_head)),
        ]
        chosen, record = confirm_plan(context, ranked, 8)
        assert record["run"] and record["train_steps"] == 8
        first, second = record["attempts"]
        assert first["label"] == "uniform bfloat16" and not first["held"]
        assert second["label"] == "head -> float32" and second["held"]
        assert record["result"] == "fell back" and record["chosen_trial"] == 2
        assert chosen.number == 2
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


def test_the_measured_line_names_the_winner_or_the_tie(ranked):
    clear = {"searched": [0.50, 0.51, 0.50], "float32": [1.00, 1.01, 1.00]}
    won = measurement_text(rank_by_measurement(ranked, _timed(ranked), clear).to_dict())
    assert "searched at 500 ms median (2x float32), ahead of every other plan" in won
    assert "3 interleaved round(s) of 2 plan(s)" in won
    tied = {"searched": [0.99, 1.02, 0.98], "float32": [1.00, 0.99, 1.01]}
    ranking = rank_by_measurement(ranked, _timed(ranked), tied)
    line = measurement_text(ranking.to_dict())
    assert "a tie within the noise" in line and "the simpler float32 at 1000 ms median" in line
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
