"""`autoprec.cli.build_parser`: every command, its defaults, and one-line usage errors."""

from __future__ import annotations

import argparse

import pytest

from autoprec import __version__, cli
from autoprec.cli import EXIT_BAD_INPUT, build_parser, main

COMMANDS = ("demo", "profile", "search", "export", "show", "diff", "hardware")

SEARCH = ["search", "model.keras", "--data", "d.npz", "--budget", "val_loss:1%"]


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise AssertionError("the autoprec parser has no subcommands")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_for_every_command(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert f"usage: autoprec {command}" in capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_runs_its_handler(command):
    assert _subparser(command).get_default("handler") is getattr(cli, command)


def test_usage_errors_are_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["search", "model.keras"])
    assert exit_info.value.code == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert error.startswith("autoprec: error: search: ") and "--data" in error
    assert len(error.splitlines()) == 1


def test_search_flags_and_their_defaults():
    defaults = build_parser().parse_args(SEARCH)
    assert (defaults.n_trials, defaults.steps_per_trial) == (20, 20)
    assert (defaults.hardware, defaults.workers, defaults.seed) == ("local", 1, 0)
    assert (defaults.float16_trials, defaults.verbose, defaults.output) == ("auto", 1, "plan.json")
    given = build_parser().parse_args([*SEARCH, "--n-trials", "3", "--steps-per-trial", "5"])
    assert (given.n_trials, given.steps_per_trial) == (3, 5)
    assert build_parser().parse_args(["demo", "--n-trials", "2"]).n_trials == 2
    demo = build_parser().parse_args(["demo", "--predict-for", "rtx3060", "--figures", "f.json"])
    assert (demo.predict_for, demo.figures) == ("rtx3060", "f.json")
    assert build_parser().parse_args(["demo"]).predict_for == "rtx4090"
    search_help = _subparser("search").format_help()
    assert "--n-trials" in search_help and "--trials" not in search_help


@pytest.mark.parametrize(
    "argv",
    [
        [*SEARCH, "--trials", "3"],
        [*SEARCH, "--train-steps", "5"],
        ["demo", "--trials", "2"],
    ],
)
def test_the_flags_renamed_in_0_2_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert "unrecognized arguments: " + argv[-2] in error and len(error.splitlines()) == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--verbose", "3"], "invalid verbose level '3' (give 0, 1 or 2)"),
        (["--float16-trials", "maybe"], "invalid choice: 'maybe'"),
        (["--n-trials", "many"], "invalid int value: 'many'"),
    ],
)
def test_bad_flag_values_name_the_flag(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*SEARCH, *flags])
    assert exit_info.value.code == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert error.startswith("autoprec: error: search: ") and message in error
    assert flags[0] in error and "(see 'autoprec search --help')" in error


def test_version_flag_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"autoprec {__version__}"


def test_debug_goes_before_the_command():
    assert build_parser().parse_args(["--debug", "hardware"]).debug is True
    assert build_parser().parse_args(["hardware"]).debug is False


def test_the_commands_are_listed_in_order_with_their_help():
    parser = build_parser()
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert tuple(subcommands.choices) == COMMANDS
    assert all(choice.help for choice in subcommands._choices_actions)
    assert [choice.dest for choice in subcommands._choices_actions] == list(COMMANDS)
    for name in COMMANDS:
        assert _subparser(name).prog == f"autoprec {name}"
