"""Tests for autoprec.search.candidates: the finalists' labels and plans, and how simple each is.

The labels and the simplicity order are pure functions; the protections, the profile's
verdicts and the dropped-protection plans are judged on a real `autoprec.profile` of a
small two-headed model; Keras' global plans and the finalists' plans, keys and ranking on
the `SearchContext` of a real (small) search with a `MultiHeadAttention` container.
"""

from __future__ import annotations

import random

import keras
import numpy as np
import optuna
import pytest
from search.search_models import labelled, prepared_search

import autoprec
from autoprec.layers import describe_model, model_fingerprint
from autoprec.plan import PrecisionPlan
from autoprec.search import TrialRecord, compute_layers, output_layers
from autoprec.search.confirmation import (
    dropped_protection,
    exact_plan,
    finalist_key,
    finalist_plan,
    fits_profile,
    keras_global_plan,
    protections,
    ranked_finalists,
    sixteen_bit_dtype,
)
from autoprec.search.record import (
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
    plan_default,
    simplicity,
)

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

        exact = exact_plan(context, plan.layers, "bfloat16")
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
