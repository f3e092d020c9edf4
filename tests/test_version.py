"""`autoprec._version`: the one version string, the one pyproject.toml and the installed package read."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import autoprec
from autoprec._version import __version__

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_is_a_release_number():
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__), __version__
    assert autoprec.__version__ is __version__


def test_pyproject_reads_the_version_from_this_module():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "autoprec._version.__version__"}


def test_the_installed_distribution_has_this_version():
    assert importlib.metadata.version("autoprec") == __version__


def test_the_changelog_releases_this_version_with_a_date():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (\d+\.\d+\.\d+) \(([^)]*)\)$", changelog, flags=re.MULTILINE)
    released = [(version, when) for version, when in headings if when != "unreleased"]
    assert released and released[0][0] == __version__, (headings, __version__)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", released[0][1])
