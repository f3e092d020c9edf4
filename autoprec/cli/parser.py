"""The `autoprec` argument parser: commands, flags and one-line usage errors."""

from __future__ import annotations

import argparse

from .._core.dtypes import FLOAT16_TRIALS
from .._version import __version__
from . import commands
from .inputs import EXIT_BAD_INPUT


class OneLineParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose usage errors are one line: `autoprec: error: ...`, exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Prints `autoprec: error: MESSAGE` and where to find the flags, then exits 2."""
        command = self.prog.removeprefix("autoprec").strip()
        where = f"{command}: " if command else ""
        self.exit(EXIT_BAD_INPUT, f"autoprec: error: {where}{message} (see '{self.prog} --help')\n")


def _verbose(text: str) -> int:
    if text not in ("0", "1", "2"):
        raise argparse.ArgumentTypeError(f"invalid verbose level {text!r} (give 0, 1 or 2)")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    """Returns the `autoprec` argument parser."""
    parser = OneLineParser(
        prog="autoprec",
        description="Per-layer automatic mixed precision for Keras 3.",
        epilog="Exit codes: 0 success, 2 usage error, 1 failure. Docs: docs/cli.md",
    )
    parser.add_argument("--version", action="version", version=f"autoprec {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add_command in (
        _add_demo,
        _add_profile,
        _add_search,
        _add_export,
        _add_show,
        _add_diff,
        _add_hardware,
    ):
        add_command(subcommands)
    return parser


def _add_demo(subcommands: argparse._SubParsersAction) -> None:
    """Adds `autoprec demo`: the built-in end-to-end run."""
    demo = subcommands.add_parser(
        "demo", help="profile, search and train a small model; print the results"
    )
    demo.add_argument("-o", "--output", default="plan.json", help="where to write the plan")
    demo.add_argument("--quick", action="store_true", help="smaller run (for tests)")
    demo.add_argument(
        "--n-trials", type=int, default=None, metavar="N", help="search trials (default: auto)"
    )
    demo.add_argument(
        "--predict-for",
        default="rtx4090",
        metavar="NAME",
        help="hardware profile whose step time is predicted beside the measured one "
        "(default rtx4090; 'none' for none)",
    )
    demo.add_argument(
        "--figures", default=None, metavar="PATH", help="also write the figures as JSON here"
    )
    demo.set_defaults(handler=commands.demo)


def _add_profile(subcommands: argparse._SubParsersAction) -> None:
    """Adds `autoprec profile`: per-layer ranges recorded during training."""
    profile = subcommands.add_parser("profile", help="record per-layer ranges during training")
    profile.add_argument("model", help="a compiled model saved as .keras")
    profile.add_argument("--data", required=True, help="DATA.npz or module:function")
    profile.add_argument("--steps", type=int, default=20, help="training steps to profile")
    profile.add_argument("--batch-size", type=int, default=32)
    profile.add_argument("-o", "--output", default="profile.json")
    profile.set_defaults(handler=commands.profile)


def _add_search(subcommands: argparse._SubParsersAction) -> None:
    """Adds `autoprec search`: the fastest plan within an accuracy budget."""
    search = subcommands.add_parser(
        "search", help="find the fastest plan within an accuracy budget"
    )
    search.add_argument("model", help="a compiled model saved as .keras")
    search.add_argument("--data", required=True, help="DATA.npz or module:function")
    search.add_argument(
        "--budget", required=True, help="METRIC:MAX_DROP, e.g. val_accuracy:0.005, or val_loss:2%%"
    )
    search.add_argument("--hardware", default="local", help="local, or a profile name (rtx4090)")
    search.add_argument("--n-trials", type=int, default=20, metavar="N", help="trials to run")
    search.add_argument("--timeout", type=float, default=None, help="seconds")
    search.add_argument(
        "--profile", default=None, metavar="FILE", help="reuse a profile from 'autoprec profile'"
    )
    search.add_argument("--storage", default=None, help="Optuna storage URL or journal file")
    search.add_argument("--study-name", default=None)
    search.add_argument(
        "--workers",
        type=int,
        default=1,
        help="local processes searching one study (a journal file next to -o by default)",
    )
    search.add_argument("--seed", type=int, default=0)
    search.add_argument(
        "--steps-per-trial", type=int, default=20, metavar="S", help="training steps per trial"
    )
    search.add_argument(
        "--validation-steps", type=int, default=None, metavar="N",
        help="validation batches per evaluation (default: all)",
    )  # fmt: skip
    search.add_argument("--batch-size", type=int, default=32)
    search.add_argument(
        "--dtypes", default=None, help="dtypes to consider, e.g. float32,bfloat16 (default: auto)"
    )
    search.add_argument(
        "--float16-trials", choices=FLOAT16_TRIALS, default="auto",
        help="train float16 natively or emulated (float32 math, float16 rounding); "
        "default: emulated where float16 has no fast kernels here",
    )  # fmt: skip
    search.add_argument(
        "--verbose", type=_verbose, default=1, metavar="{0,1,2}",
        help="0 silent, 1 one line per trial (default), 2 more detail",
    )  # fmt: skip
    search.add_argument("-o", "--output", default="plan.json")
    search.set_defaults(handler=commands.search)


def _add_export(subcommands: argparse._SubParsersAction) -> None:
    """Adds `autoprec export`: a model saved with a plan applied and stored inside."""
    export = subcommands.add_parser(
        "export", help="save a model with a plan applied and stored inside"
    )
    export.add_argument("plan", help="plan.json (or a .keras model that stores one)")
    export.add_argument("model", help="the model, saved as .keras")
    export.add_argument("-o", "--output", required=True, help="the new .keras file")
    export.set_defaults(handler=commands.export)


def _add_show(subcommands: argparse._SubParsersAction) -> None:
    """Adds `autoprec show`: a plan or profile printed as a table."""
    show = subcommands.add_parser("show", help="print a plan or profile as a table")
    show.add_argument("file", help="plan.json, profile.json, or a .keras model saved with a plan")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.set_defaults(handler=commands.show)


def _add_diff(subcommands: argparse._SubParsersAction) -> None:
    """Adds `autoprec diff`: two plans compared layer by layer."""
    diff = subcommands.add_parser("diff", help="compare two plans layer by layer")
    diff.add_argument("first", help="a plan file (or a .keras model that stores one)")
    diff.add_argument("second", help="the plan to compare it with")
    diff.add_argument("--json", action="store_true", help="print JSON instead of text")
    diff.add_argument(
        "--exit-code", action="store_true", help="exit 1 if the plans differ, 0 if identical"
    )
    diff.set_defaults(handler=commands.diff)


def _add_hardware(subcommands: argparse._SubParsersAction) -> None:
    """Adds `autoprec hardware`: the hardware profiles, or this machine detected."""
    hardware = subcommands.add_parser(
        "hardware", help="list hardware profiles or detect this machine"
    )
    hardware.add_argument("name", nargs="?", help="show one profile in full")
    hardware.add_argument("--detect", action="store_true", help="describe this machine")
    hardware.add_argument("--json", action="store_true", help="print JSON instead of text")
    hardware.set_defaults(handler=commands.hardware)
