"""Tests for `autoprec.search.preparation`: the search space, the float32 reference, the context."""

from __future__ import annotations

import dataclasses

import optuna
import pytest
from search.search_models import prepared_search

from autoprec.search import Budget
from autoprec.search.evaluator import FidelityCheck
from autoprec.search.preparation import ReferenceCheck, SearchSpace, search_metadata


def test_the_first_stages_return_typed_values_that_agree():
    with prepared_search(keep_float32=("dense_1",)) as prepared:
        space, reference, context = prepared.space, prepared.reference, prepared.context
        assert isinstance(space, SearchSpace) and isinstance(reference, ReferenceCheck)
        with pytest.raises(dataclasses.FrozenInstanceError):
            space.dtypes = ()
        assert space.dtypes == ("float32", "bfloat16") and space.float16_trials is None
        assert space.hardware.name == "rtx4090" and space.table.source.startswith("predicted")
        assert space.profile is None  # no float16: nothing to profile
        assert space.allowed["dense_1"] == ("float32",) and "dense_1" in space.removed
        assert space.outputs and all(path in space.compute for path in space.outputs)
        grouped = {path for group in space.groups for path in group.paths}
        assert grouped == set(space.compute)
        assert isinstance(reference.fidelity, FidelityCheck) and reference.spread is None
        assert reference.reference == reference.metrics["accuracy"] == context.reference
        assert context.risk[sorted(space.outputs)[0]] >= 2.0  # output layers are riskiest
        assert context.float32_seconds == space.costs.step(context.normalise({}))[0]


def test_the_reference_spread_is_measured_when_asked_and_the_metadata_carries_it():
    budget = Budget("val_accuracy", max_drop=0.5)
    with prepared_search(budget=budget, reference_repeats=1) as prepared:
        spread = prepared.reference.spread
        assert spread is not None and spread >= 0
        study = optuna.create_study(study_name="meta")
        metadata = search_metadata(
            prepared.request, prepared.space, prepared.reference, study, 2, 32
        )
        assert metadata["hardware"] == "rtx4090"
        assert metadata["budget"]["reference_spread"] == spread
        search = metadata["search"]
        assert search["study_name"] == "meta" and search["dtypes"] == ["float32", "bfloat16"]
        assert search["fidelity_check"] == prepared.reference.fidelity.to_dict()
