"""Tests for `autoprec.search.preparation`: the search space, the float32 reference, the context."""

from __future__ import annotations

import optuna
from search.search_models import prepared_search

from autoprec.search import Budget
from autoprec.search.evaluator import FidelityCheck
from autoprec.search.preparation import search_metadata


def test_the_first_stages_return_typed_values_that_agree():
    with prepared_search(keep_float32=("dense_1",)) as prepared:
        context = prepared.context
        assert context.dtypes == ("float32", "bfloat16") and context.float16_trials is None
        assert context.hardware_profile.name == "rtx4090" and context.table.source.startswith(
            "predicted"
        )
        assert context.profile is None  # no float16: nothing to profile
        assert context.allowed["dense_1"] == ("float32",) and "dense_1" in context.removed
        assert context.outputs and all(path in context.compute for path in context.outputs)
        grouped = {path for group in context.groups for path in group.paths}
        assert grouped == set(context.compute)
        assert isinstance(context.fidelity, FidelityCheck) and context.spread is None
        assert context.reference == context.reference_metrics["accuracy"]
        assert context.risk[sorted(context.outputs)[0]] >= 2.0  # output layers are riskiest
        assert context.float32_seconds == context.costs.step(context.normalise({}))[0]


def test_the_reference_spread_is_measured_when_asked_and_the_metadata_carries_it():
    budget = Budget("val_accuracy", max_drop=0.5)
    with prepared_search(budget=budget, reference_repeats=1) as prepared:
        spread = prepared.context.spread
        assert spread is not None and spread >= 0
        study = optuna.create_study(study_name="meta")
        prepared.context.study = study
        metadata = search_metadata(prepared.context)
        assert metadata["hardware"] == "rtx4090"
        assert metadata["budget"]["reference_spread"] == spread
        search = metadata["search"]
        assert search["study_name"] == "meta" and search["dtypes"] == ["float32", "bfloat16"]
        assert search["fidelity_check"] == prepared.context.fidelity.to_dict()
