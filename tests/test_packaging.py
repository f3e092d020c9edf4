"""What pyproject.toml declares is what CI tests and what the package holds.

- the minimum-version CI step installs exactly the declared floors (.ci/min_pins.py),
  and .ci/run runs that step after README's test command;
- every package-data glob matches a file that exists and the imported package reads it;
- `autoprec.__version__` is the installed distribution's version.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from importlib import resources
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import pytest

import autoprec

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def load_min_pins():
    """The module .ci/min_pins.py (not a package: loaded from its file)."""
    spec = importlib.util.spec_from_file_location("min_pins", ROOT / ".ci" / "min_pins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_minimum_pins_are_the_declared_floors():
    pins = load_min_pins().minimum_pins(ROOT / "pyproject.toml")
    declared = PYPROJECT["project"]["dependencies"]
    assert len(pins) == len(declared)
    for pin, requirement in zip(pins, declared):
        name, version = pin.split("==")
        assert requirement.startswith(name) and f">={version}" in requirement, (pin, requirement)
    names = {pin.split("==")[0].lower().replace("_", "-") for pin in pins}
    assert {"tensorflow", "keras", "numpy", "optuna", "ml-dtypes"} <= names


def test_a_dependency_without_a_floor_is_refused(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["numpy>=1.24", "keras"]\n')
    with pytest.raises(ValueError, match="'keras' needs exactly one '>=' floor"):
        load_min_pins().minimum_pins(pyproject)


def test_ci_runs_the_minimum_version_step_after_the_readme_tests():
    run = (ROOT / ".ci" / "run").read_text().splitlines()
    readme_line = run.index('pip install -e ".[test]" && python -m pytest -q')
    assert "bash .ci/min_versions.sh" in run[readme_line + 1 :]
    step = (ROOT / ".ci" / "min_versions.sh").read_text()
    assert ".ci/min_pins.py" in step and ".ci/min_smoke.py" in step
    assert "--no-deps ." in step  # autoprec itself must not pull newer versions in


def test_package_data_globs_match_existing_files():
    package_data = PYPROJECT["tool"]["setuptools"]["package-data"]
    assert package_data, "no package data declared"
    for package, patterns in package_data.items():
        for pattern in patterns:
            matches = sorted((ROOT / package.replace(".", "/")).glob(pattern))
            assert matches, f"pyproject.toml package-data {package}: {pattern!r} matches no file"
            for match in matches:
                relative = match.relative_to(ROOT / package.replace(".", "/")).as_posix()
                assert resources.files(package).joinpath(relative).read_bytes()


def test_version_is_the_installed_distribution_version():
    assert autoprec.__version__ == importlib.metadata.version("autoprec")
