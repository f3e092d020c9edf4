"""The top level of `autoprec`: the names a user types, and the moved ones still resolving."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import autoprec


def test_the_top_level_keeps_about_twenty_names():
    assert 18 <= len(autoprec.__all__) <= 24, autoprec.__all__


@pytest.mark.parametrize("name", sorted(autoprec._MOVED_TO))
def test_a_moved_name_resolves_with_a_deprecation_warning_naming_its_new_spelling(name):
    new_home = importlib.import_module(f"autoprec.{autoprec._MOVED_TO[name]}")
    with pytest.warns(DeprecationWarning, match=rf"autoprec\.{autoprec._MOVED_TO[name]}\.{name}"):
        old = getattr(autoprec, name)
    assert old is getattr(new_home, name)
    assert name not in autoprec.__all__


def test_an_unknown_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        autoprec.no_such_name  # noqa: B018


def test_import_autoprec_alone_does_not_load_keras():
    code = "import sys, autoprec; autoprec.__version__; print('keras' in sys.modules)"
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert output.strip() == "False"
