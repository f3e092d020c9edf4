"""Tests for the plans a study starts with and the neighbours it explores (`autoprec.search.study`)."""

from __future__ import annotations

import keras
import numpy as np
import optuna
from search.search_models import (
    attention_classifier,
    far_regression,
    far_targets,
    labelled,
    prepared_search,
)

import autoprec
from autoprec.layers import describe_model
from autoprec.plan import PrecisionPlan
from autoprec.search import (
    Budget,
    SearchSettings,
    TrialRecord,
    compute_layers,
    output_layers,
    search,
)
from autoprec.search.result import assignment_key, keras_dtype, keras_label
from autoprec.search.selection import (
    dropped_protection,
    fits_profile,
    keras_global_plan,
    protections,
)
from autoprec.search.study import (
    WarmStart,
    claim_study_lock,
    enqueue_candidates,
    enqueue_warm_starts,
    has_warm_starts,
    resolve_storage,
    warm_starts,
)


def test_every_study_starts_with_float32_the_uniform_plans_and_the_heuristic():
    with prepared_search() as prepared:
        context = prepared.context
        starts = warm_starts(context)
        labels = [start.label for start in starts]
        assert labels[0] == "float32" and "uniform bfloat16" in labels
        assert len({assignment_key(start.assignment) for start in starts}) == len(starts)
        for start in starts:
            assert set(start.assignment) == set(context.compute)
            assert context.assignment(start.params).keys() == start.assignment.keys()


def test_warm_starts_are_enqueued_once_with_their_records(tmp_path):
    path = tmp_path / "warm.log"
    optuna.create_study(storage=resolve_storage(path), study_name="s")
    study = optuna.load_study(study_name="s", storage=resolve_storage(path))
    starts = [
        WarmStart("float32", {"dense": "float32"}, {"dense": "float32"}),
        WarmStart("uniform bfloat16", {"dense": "bfloat16"}, {"dense": "bfloat16"}),
    ]
    assert not has_warm_starts(study)
    assert enqueue_warm_starts(study, starts) == 2
    assert has_warm_starts(study) and study.user_attrs["warm_starts_enqueued"] is True
    records = [TrialRecord.from_trial(trial) for trial in study.trials]
    assert [(r.warm_start, r.assignment) for r in records] == [
        ("float32", {"dense": "float32"}),
        ("uniform bfloat16", {"dense": "bfloat16"}),
    ]
    assert records[0].assignment_key == assignment_key({"dense": "float32"})
    assert enqueue_warm_starts(study, starts) == 0  # a resumed run
    assert optuna.get_all_study_names(resolve_storage(path)) == ["s"]  # the lock is released


def test_a_process_that_finds_the_lock_taken_enqueues_nothing_and_does_not_wait(tmp_path):
    path = tmp_path / "busy.log"
    optuna.create_study(storage=resolve_storage(path), study_name="s")
    holder, other = (
        optuna.load_study(study_name="s", storage=resolve_storage(path)) for _ in range(2)
    )
    assert claim_study_lock(holder, "warm-starts") is not None
    assert enqueue_warm_starts(other, [WarmStart("float32", {"d": "float32"}, {})]) == 0
    assert not other.trials and not has_warm_starts(other)


def test_keras_global_policy_is_every_layer_in_16_bit_containers_included():
    model = attention_classifier()
    with prepared_search(model, labelled(model, 256)) as prepared:
        context = prepared.context
        plan = keras_global_plan(context, "bfloat16")
        uniform = PrecisionPlan.uniform(model, "bfloat16")
        assert plan.layers == uniform.layers and plan.default == uniform.default == "bfloat16"
        assert set(plan.resolve().values()) == {"bfloat16"}  # softmax, norm, head, container
        # The search's own uniform plan gives the container its sub-layers' dtype, as Keras does.
        searched = context.plan_for(context.uniform_assignment("bfloat16")).resolve()
        assert searched["attention"] == "bfloat16" and searched["attention/softmax"] == "bfloat16"
        kept = keras_global_plan(context, "bfloat16", keep_float32=("head",)).resolve()
        assert kept["head"] == "float32" and kept["norm"] == kept["attention"] == "bfloat16"
        assert keras_label("bfloat16") == "keras mixed_bfloat16"
        assert keras_dtype("keras mixed_float16") == "float16" and keras_dtype("heuristic") is None


def _far_head_model() -> keras.Model:
    """A normalised hidden layer and a head whose outputs sit near 1e5 (above float16's 65504)."""
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(32, activation="relu", name="wide")(inputs)
    hidden = keras.layers.LayerNormalization(name="norm")(hidden)
    outputs = keras.layers.Dense(1, name="head", bias_initializer=keras.initializers.Constant(1e5))(
        hidden
    )
    model = keras.Model(inputs, outputs, name="far_head")
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model


def test_a_protection_is_dropped_only_where_the_profile_shows_its_ranges_fit():
    model = _far_head_model()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 16)).astype("float32")
    y = (1e5 + rng.normal(size=(64, 1))).astype("float32")
    prof = autoprec.profile(model, (x, y), steps=2, batch_size=32, verbose=0)
    infos = describe_model(model)
    compute = compute_layers(infos)
    kinds = protections(compute, infos, sorted(output_layers(model, infos)))
    assert kinds == {"softmax": (), "normalisation": ("norm",), "outputs": ("head",)}
    allowed = {path: ("float32", "bfloat16", "float16") for path in compute}
    for dtype in ("bfloat16", "float16"):
        plan = {"wide": dtype, "norm": "float32", "head": "float32"}
        plans, skipped = dropped_protection(plan, kinds, allowed, prof)
        assert plans["no float32 normalisation"] == {**plan, "norm": dtype}
        assert skipped["no float32 softmax"] == "no softmax layer kept in float32"
        if dtype == "bfloat16":  # 1e5 is in bfloat16's range
            assert plans["no float32 outputs"] == {**plan, "head": "bfloat16"}
        else:
            assert "no float32 outputs" not in plans
            assert skipped["no float32 outputs"] == (
                "the profile does not show the outputs ranges fit float16"
            )
    none, why = dropped_protection(plan, kinds, allowed, None)
    assert none == {} and why["no float32 outputs"] == "no profile to show the ranges fit"
    float32 = {path: "float32" for path in compute}
    assert dropped_protection(float32, kinds, allowed, prof)[0] == {}
    only_float32 = {**allowed, "head": ("float32",)}  # keep_float32: the head may not move
    plans, _ = dropped_protection({**float32, "wide": "bfloat16"}, kinds, only_float32, prof)
    assert "no float32 outputs" not in plans and "no float32 normalisation" in plans
    assert fits_profile(prof, "norm/inner", "float16")  # judged by its recorded container
    assert not fits_profile(prof, "missing", "bfloat16")


def test_candidates_are_enqueued_once_per_assignment_and_labels_may_repeat():
    study = optuna.create_study()
    starts = [
        WarmStart("no float32 outputs", {"dense": "bfloat16", "head": "bfloat16"}, {}),
        WarmStart("no float32 outputs", {"dense": "float16", "head": "float16"}, {}),
    ]
    assert len(enqueue_candidates(study, starts)) == 2
    assert enqueue_candidates(study, starts) == []
    records = [TrialRecord.from_trial(trial) for trial in study.trials]
    assert [r.warm_start for r in records] == ["no float32 outputs"] * 2
    assert records[1].assignment_key == assignment_key(starts[1].assignment)
    assert all(t.state == optuna.trial.TrialState.WAITING for t in study.trials)


def test_after_the_warm_starts_a_neighbour_repairs_a_faster_plan_that_missed_the_budget():
    keras.utils.set_random_seed(0)
    train, val = far_targets()
    result = search(
        far_regression(),
        train,
        val,
        budget=Budget("val_mae", max_relative_drop=0.1),
        hardware="rtx4090",
        n_trials=4,
        verbose=0,
        settings=SearchSettings(
            dtypes=["float32", "bfloat16"],
            steps_per_trial=2,
            cost_batch_size=4096,
            proxy_batches=1,
            confirm_steps=0,
        ),
    )
    records = [TrialRecord.from_trial(t) for t in result.study.trials]
    warm = [r for r in records if r.warm_start]
    uniform = {r.warm_start: r for r in warm}["uniform bfloat16"]
    assert uniform.budget_violation > 0  # the bfloat16 head misses the budget
    neighbour = records[len(warm)]
    assert neighbour.neighbour.endswith("-> float32")
    before, after = uniform.assignment, neighbour.assignment
    changed = [path for path in before if before[path] != after[path]]
    assert len(changed) == 1 and after[changed[0]] == "float32"
    assert neighbour.predicted_seconds < result.float32_predicted_seconds
    assert result.plan.layers["head"] == "float32"
