"""Prints `name==floor` for every runtime dependency in pyproject.toml, one per line.

.ci/min_versions.sh installs these pins, so the floors it tests are the ones declared.
Every dependency must declare a floor (`>=`); a dependency without one is an error.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
_FLOOR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)")


def minimum_pins(pyproject: Path = PYPROJECT) -> list[str]:
    """Returns `["name==floor", ...]` for `[project].dependencies` of `pyproject`.

    Args:
        pyproject: the pyproject.toml to read.

    Returns:
        One pin per dependency, in the declared order.

    Raises:
        ValueError: naming a dependency that has no `>=` floor.
    """
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    pins = []
    for requirement in dependencies:
        match = _FLOOR.match(requirement)
        name, specifiers = match.group(1), match.group(2)
        floors = [
            s.strip()[2:].strip() for s in specifiers.split(",") if s.strip().startswith(">=")
        ]
        if len(floors) != 1:
            raise ValueError(
                f"{pyproject}: dependency {requirement!r} needs exactly one '>=' floor "
                "(the version .ci/min_versions.sh tests); add one, e.g. 'numpy>=1.24'."
            )
        pins.append(f"{name}=={floors[0]}")
    return pins


if __name__ == "__main__":
    sys.stdout.write("".join(pin + "\n" for pin in minimum_pins()))
