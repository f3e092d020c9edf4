"""The docs cannot rot: the tutorial runs, and the API and CLI references cover every name and flag.

- Every ```python block of docs/tutorial.md runs, in order, in one fresh Python
  process (cwd a temporary folder, its own cost cache), and every `autoprec ...`
  line of its ```bash blocks runs there too, through `autoprec.cli.main`, and
  must exit 0.
- Every name in `autoprec.__all__` has a heading in docs/api.md, and so does every
  public function and class of `autoprec.hardware`, `autoprec.layers`,
  `autoprec.runtime.training`, `autoprec.runtime.kernels` and `autoprec.runtime.guard`;
  every signature written there is the code's (`inspect.signature`, annotations left out).
- Every `autoprec` subcommand has a section in docs/cli.md that names each of its
  flags.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# A hang guard, not a speed check: the tutorial takes 2-3 minutes alone on two cores and
# shares them with the other test process.
TUTORIAL_TIMEOUT_SECONDS = 600

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(path: Path) -> list[tuple[str, str]]:
    """Returns `(language, code)` of every fenced block in a Markdown file, in order."""
    return [(match.group(1), match.group(2)) for match in _FENCE.finditer(path.read_text())]


def tutorial_script() -> str:
    """Returns the tutorial as one Python script: its python blocks and its CLI lines."""
    parts = [
        "import shlex as _shlex\n"
        "def _cli(line):\n"
        "    import autoprec.cli\n"
        "    print('$ ' + line, flush=True)\n"
        "    code = autoprec.cli.main(_shlex.split(line)[1:])\n"
        "    assert code == 0, f'{line!r} exited {code}'\n"
    ]
    for index, (language, code) in enumerate(_blocks(DOCS / "tutorial.md")):
        marker = f"print('--- tutorial block {index} ({language})', flush=True)\n"
        if language == "python":
            parts.append(marker + code)
        elif language == "bash":
            lines = [line.strip() for line in code.splitlines() if line.strip()]
            commands = [line for line in lines if line.startswith("autoprec ")]
            assert commands == lines, f"bash block {index}: only autoprec commands can be run"
            parts.append(marker + "".join(f"_cli({line!r})\n" for line in commands))
    return "\n".join(parts)


def test_tutorial_runs_top_to_bottom(tmp_path):
    script = tmp_path / "tutorial.py"
    script.write_text(tutorial_script())
    compile(script.read_text(), str(script), "exec")
    env = dict(os.environ)
    env.update(
        KERAS_BACKEND="tensorflow",
        TF_CPP_MIN_LOG_LEVEL="3",
        AUTOPREC_CACHE_DIR=str(tmp_path / "cache"),
        MPLBACKEND="Agg",
    )
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TUTORIAL_TIMEOUT_SECONDS,
    )
    assert result.returncode == 0, (result.stdout[-4000:], result.stderr[-4000:])
    output = result.stdout
    assert "('sensor_proj',)" in output  # the profile finds the float16 overflow
    assert "FlooredLossScaleOptimizer" in output  # a float16 layer got loss scaling
    for written in ("plan.json", "plan_rtx4060ti.json", "model.keras", "cli_plan.json"):
        assert (tmp_path / written).exists(), written


def test_tutorial_has_no_stale_blocks():
    languages = {language for language, _ in _blocks(DOCS / "tutorial.md")}
    assert languages <= {"python", "bash"}, languages


def _api_headings() -> str:
    return "\n".join(
        line for line in (DOCS / "api.md").read_text().splitlines() if line.startswith("#")
    )


def _documented(headings: str, qualified: str) -> bool:
    return re.search(r"`" + re.escape(qualified) + r"[(`]", headings) is not None


def test_every_public_name_has_a_heading_in_api_md():
    import autoprec

    headings = _api_headings()
    missing = [name for name in autoprec.__all__ if not _documented(headings, f"autoprec.{name}")]
    assert not missing, f"docs/api.md has no heading for: {missing}"


@pytest.mark.parametrize(
    "module_name",
    ["hardware", "layers", "runtime.training", "runtime.kernels", "runtime.guard"],
)
def test_every_public_function_of_the_documented_modules_is_in_api_md(module_name):
    import importlib

    module = importlib.import_module(f"autoprec.{module_name}")
    headings = _api_headings()
    if hasattr(module, "__path__"):  # a package documents what it exports
        own = {name: getattr(module, name) for name in module.__all__}
    else:
        own = {
            name: value
            for name, value in vars(module).items()
            if getattr(value, "__module__", None) == module.__name__
        }
    missing = [
        name
        for name, value in own.items()
        if not name.startswith("_")
        and (inspect.isfunction(value) or inspect.isclass(value))
        and not _documented(headings, f"autoprec.{module_name}.{name}")
        and not _documented(headings, f"autoprec.{name}")
        and not _documented(headings, f"autoprec.{module_name.split('.')[0]}.{name}")
    ]
    assert not missing, f"docs/api.md has no heading for autoprec.{module_name}: {missing}"


def _plain_signature(obj) -> str:
    """The signature as api.md writes it: parameters and defaults, no annotations."""
    signature = inspect.signature(obj)
    parameters = [
        parameter.replace(annotation=inspect.Parameter.empty)
        for parameter in signature.parameters.values()
    ]
    return str(signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty))


def test_signatures_in_api_md_match_the_code():
    import importlib

    wrong = []
    for match in re.finditer(r"^### `(autoprec(?:\.\w+)+)(\(.*\))`$", _api_headings(), re.M):
        qualified, written = match.groups()
        module_name, _, name = qualified.rpartition(".")
        obj = getattr(importlib.import_module(module_name), name)
        if written != _plain_signature(obj):
            wrong.append(f"{qualified}: docs {written} != code {_plain_signature(obj)}")
    assert not wrong, "\n".join(wrong)


def _cli_sections() -> dict[str, str]:
    """Returns `{command: text}` of the `## autoprec COMMAND` sections of docs/cli.md."""
    text = (DOCS / "cli.md").read_text()
    sections = {}
    for match in re.finditer(r"^## `autoprec (\w+)[^\n]*\n(.*?)(?=^## |\Z)", text, re.M | re.S):
        sections[match.group(1)] = match.group(2)
    return sections


def _subcommands():
    import argparse

    from autoprec.cli import build_parser

    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return parser, dict(action.choices)
    raise AssertionError("the autoprec parser has no subcommands")


def test_every_cli_command_and_flag_is_in_cli_md():
    parser, commands = _subcommands()
    text = (DOCS / "cli.md").read_text()
    for action in parser._actions:
        for option in action.option_strings:
            assert f"`{option}" in text or f" {option}" in text, option
    sections = _cli_sections()
    assert set(commands) <= set(sections), sorted(set(commands) - set(sections))
    for name, subparser in commands.items():
        for action in subparser._actions:
            for option in action.option_strings:
                if option in ("-h", "--help"):
                    continue
                assert re.search(re.escape(option) + r"(?![\w-])", sections[name]), (
                    f"docs/cli.md section 'autoprec {name}' does not mention {option}"
                )
            if not action.option_strings and action.dest != "help":
                assert action.dest.upper() in sections[name], (name, action.dest)


def test_cli_md_states_the_exit_codes():
    text = (DOCS / "cli.md").read_text()
    for fragment in ("`0`", "`1`", "`2`", "--debug"):
        assert fragment in text, fragment


if __name__ == "__main__":  # print the generated tutorial script
    print(textwrap.dedent(tutorial_script()))
