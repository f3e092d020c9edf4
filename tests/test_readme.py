"""The README's two commands are the ones CI runs."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.strip().splitlines()]


def test_readme_opens_with_exactly_two_commands():
    text = (ROOT / "README.md").read_text()
    assert text.index("```bash") < text.index("\n\n", text.index("# autoprec") + 10) + 5
    commands = _readme_commands()
    assert len(commands) == 2
    assert commands[0].startswith("pip install .")
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci_script = (ROOT / ".ci" / "run").read_text()
    assert _readme_commands()[1] in ci_script.splitlines()
