"""`autoprec.errors`: one base class to catch, each error also the built-in type callers expect."""

from __future__ import annotations

import pytest

import autoprec
import autoprec.runtime
from autoprec import errors


@pytest.mark.parametrize(
    ("error_class", "builtin"),
    [
        (errors.PlanError, ValueError),
        (errors.ProfileError, ValueError),
        (errors.HardwareError, ValueError),
        (errors.BackendError, RuntimeError),
    ],
)
def test_every_error_is_an_autoprec_error_and_its_builtin_type(error_class, builtin):
    assert issubclass(error_class, errors.AutoprecError) and issubclass(error_class, builtin)
    with pytest.raises(errors.AutoprecError, match="plan.json: layer 'head'"):
        raise error_class("plan.json: layer 'head'")


def test_the_errors_are_the_public_names(tmp_path):
    for name in ("AutoprecError", "PlanError"):
        assert getattr(autoprec, name) is getattr(errors, name)
    assert issubclass(autoprec.runtime.NonFiniteTrainingError, errors.AutoprecError)


def test_a_library_failure_is_caught_as_autoprec_error(tmp_path):
    missing = tmp_path / "missing.json"
    with pytest.raises(errors.AutoprecError, match="missing.json"):
        autoprec.PrecisionPlan.load(missing)
    with pytest.raises(ValueError, match="rtx9999"):  # HardwareError is a ValueError too
        autoprec.hardware.get("rtx9999")
