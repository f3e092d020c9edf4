"""The `autoprec` command: a thin layer over the library.

Exit codes: 0 success, 2 bad input (one line naming the file or field; add
`--debug` for a traceback), 1 internal error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .errors import AutoprecError

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2


class UsageError(AutoprecError, ValueError):
    """Bad command-line input: a file, field or flag the user must fix."""


# ---------------------------------------------------------------------- inputs


def _load_keras_model(path: str):
    import keras

    model_path = Path(path)
    if not model_path.exists():
        raise UsageError(f"{model_path}: no such model file; give a .keras file saved by Keras.")
    if model_path.suffix != ".keras":
        raise UsageError(f"{model_path}: expected a .keras file (model.save('model.keras')).")
    from .runtime import load_model

    try:
        model = load_model(model_path)
    except AutoprecError:
        raise
    except Exception as error:  # Keras raises many types for a bad archive
        raise UsageError(f"{model_path}: cannot load the model: {error}") from None
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", False):
        raise UsageError(
            f"{model_path}: the model is not compiled; save it after model.compile(...) so "
            "autoprec knows its loss, optimizer and metrics."
        )
    keras.utils.set_random_seed(0)
    return model


def load_data(spec: str) -> dict[str, Any]:
    """Loads training and validation data from a `.npz` file or a `module:function` spec.

    Args:
        spec: `DATA.npz` holding `x_train, y_train, x_val, y_val`, or
            `module:function` returning `(train_data, val_data)` (each a `(x, y)`
            tuple or a `tf.data.Dataset`).

    Returns:
        `{"train": ..., "val": ...}`.
    """
    if spec.endswith(".npz"):
        path = Path(spec)
        if not path.exists():
            raise UsageError(f"{path}: no such data file.")
        try:
            arrays = dict(__import__("numpy").load(path, allow_pickle=False))
        except Exception as error:
            raise UsageError(f"{path}: not a readable .npz file: {error}") from None
        missing = [key for key in ("x_train", "y_train", "x_val", "y_val") if key not in arrays]
        if missing:
            raise UsageError(
                f"{path}: missing array(s) {', '.join(missing)}; the file must hold "
                "x_train, y_train, x_val, y_val (numpy.savez)."
            )
        return {
            "train": (arrays["x_train"], arrays["y_train"]),
            "val": (arrays["x_val"], arrays["y_val"]),
        }
    if ":" not in spec:
        raise UsageError(
            f"--data {spec!r}: give a .npz file (x_train, y_train, x_val, y_val) or "
            "module:function returning (train_data, val_data)."
        )
    module_name, function_name = spec.split(":", 1)
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(
            f"--data {spec!r}: cannot import module {module_name!r}: {error}"
        ) from None
    finally:
        sys.path.pop(0)
    function = getattr(module, function_name, None)
    if not callable(function):
        raise UsageError(f"--data {spec!r}: {module_name} has no function {function_name!r}.")
    result = function()
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise UsageError(
            f"--data {spec!r}: {function_name}() must return (train_data, val_data), "
            f"got {type(result).__name__}."
        )
    return {"train": result[0], "val": result[1]}


def _read_json_kind(path: str) -> tuple[str, Any]:
    from ._core.io import read_json_file

    data = read_json_file(path, UsageError, "plan or profile")
    if isinstance(data, dict):
        if data.get("kind") == "autoprec.profile":
            return "profile", data
        if data.get("format", "autoprec.plan") == "autoprec.plan" and "format_version" in data:
            return "plan", data
    kind = data.get("format", data.get("kind")) if isinstance(data, dict) else type(data).__name__
    raise UsageError(
        f"{path}: not an autoprec plan or profile (format {kind!r}); "
        "give a file written by autoprec (plan.save or profile.save)."
    )


def _load_plan(path: str):
    from .plan import PrecisionPlan

    kind, data = _read_json_kind(path)
    if kind != "plan":
        raise UsageError(f"{path}: this is a {kind}, not a precision plan.")
    return PrecisionPlan.from_dict(data, source=path)


# ---------------------------------------------------------------------- commands


def _command_show(args: argparse.Namespace) -> int:
    kind, data = _read_json_kind(args.file)
    if kind == "plan":
        from .plan import PrecisionPlan

        print(PrecisionPlan.from_dict(data, source=args.file).summary())
    else:
        from .profiler import Profile

        print(Profile.load(args.file).summary())
    return EXIT_OK


def _command_diff(args: argparse.Namespace) -> int:
    first, second = _load_plan(args.first), _load_plan(args.second)
    difference = first.diff(second)
    print(f"--- {args.first}\n+++ {args.second}")
    print(difference)
    return EXIT_OK


def _command_hardware(args: argparse.Namespace) -> int:
    from . import hardware

    if args.detect:
        print(hardware.detect().summary())
        return EXIT_OK
    if args.name:
        print(hardware.get(args.name).summary())
        return EXIT_OK
    for name in hardware.names():
        profile = hardware.get(name)
        fast = ", ".join(dtype for dtype in ("bfloat16", "float16") if profile.is_fast(dtype))
        print(f"{name:<22} {profile.kind:<4} fast 16-bit: {fast or 'none'}")
    return EXIT_OK


def _command_profile(args: argparse.Namespace) -> int:
    from .profiler import profile

    model = _load_keras_model(args.model)
    data = load_data(args.data)
    result = profile(model, data["train"], steps=args.steps, batch_size=args.batch_size)
    result.save(args.output)
    print(result.summary())
    print(f"profile written to {args.output}")
    return EXIT_OK


def _parse_budget(text: str):
    from .search import Budget

    metric, separator, amount = text.partition(":")
    if not separator or not metric:
        raise UsageError(
            f"--budget {text!r}: use METRIC:MAX_DROP (e.g. val_accuracy:0.005) or "
            "METRIC:PERCENT% for a relative drop (e.g. val_loss:2%)."
        )
    try:
        if amount.endswith("%"):
            return Budget(metric, max_relative_drop=float(amount[:-1]) / 100.0)
        return Budget(metric, max_drop=float(amount))
    except ValueError as error:
        raise UsageError(f"--budget {text!r}: {error}") from None


def _parse_dtypes(text: str | None) -> tuple[str, ...] | None:
    if not text:
        return None
    from ._core.dtypes import canonical_dtype

    try:
        return tuple(canonical_dtype(item.strip(), "--dtypes") for item in text.split(","))
    except AutoprecError as error:
        raise UsageError(str(error)) from None


def _command_search(args: argparse.Namespace) -> int:
    from .search import SearchSettings, search, search_in_processes

    budget = _parse_budget(args.budget)
    model = _load_keras_model(args.model)
    data = load_data(args.data)
    settings = {
        "budget": budget,
        "hardware": args.hardware,
        "n_trials": args.trials,
        "timeout": args.timeout,
        "settings": SearchSettings(
            seed=args.seed,
            plan_path=args.output,
            steps_per_trial=args.train_steps,
            batch_size=args.batch_size,
            dtypes=_parse_dtypes(args.dtypes),
        ),
    }
    if args.workers < 1:
        raise UsageError(f"--workers {args.workers}: give at least 1 process.")
    if args.workers > 1:
        storage = args.storage or f"{args.output}.search.log"
        result = search_in_processes(
            args.workers,
            model,
            data["train"],
            data["val"],
            storage=storage,
            study_name=args.study_name or "autoprec",
            **settings,
        )
    else:
        result = search(
            model,
            data["train"],
            data["val"],
            storage=args.storage,
            study_name=args.study_name,
            **settings,
        )
    result.plan.save(args.output)
    print(result.report())
    print(f"plan written to {args.output}")
    return EXIT_OK


def _command_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(output=args.output, quick=args.quick, trials=args.trials)
    return EXIT_OK


# ---------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """Returns the `autoprec` argument parser."""
    parser = argparse.ArgumentParser(
        prog="autoprec",
        description="Per-layer automatic mixed precision for Keras 3.",
        epilog="Exit codes: 0 success, 2 bad input, 1 internal error. Docs: docs/cli.md",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo", help="profile, search and train a small model; print the results"
    )
    demo.add_argument("-o", "--output", default="plan.json", help="where to write the plan")
    demo.add_argument("--quick", action="store_true", help="smaller run (for tests)")
    demo.add_argument("--trials", type=int, default=None, help="search trials (default: auto)")
    demo.set_defaults(handler=_command_demo)

    profile = commands.add_parser("profile", help="record per-layer ranges during training")
    profile.add_argument("model", help="a compiled model saved as .keras")
    profile.add_argument("--data", required=True, help="DATA.npz or module:function")
    profile.add_argument("--steps", type=int, default=20, help="training steps to profile")
    profile.add_argument("--batch-size", type=int, default=32)
    profile.add_argument("-o", "--output", default="profile.json")
    profile.set_defaults(handler=_command_profile)

    search = commands.add_parser("search", help="find the fastest plan within an accuracy budget")
    search.add_argument("model", help="a compiled model saved as .keras")
    search.add_argument("--data", required=True, help="DATA.npz or module:function")
    search.add_argument(
        "--budget", required=True, help="METRIC:MAX_DROP, e.g. val_accuracy:0.005, or val_loss:2%%"
    )
    search.add_argument("--hardware", default="local", help="local, or a profile name (rtx4090)")
    search.add_argument("--trials", type=int, default=20)
    search.add_argument("--timeout", type=float, default=None, help="seconds")
    search.add_argument("--storage", default=None, help="Optuna storage URL or journal file")
    search.add_argument("--study-name", default=None)
    search.add_argument(
        "--workers",
        type=int,
        default=1,
        help="local processes searching one study (a journal file next to -o by default)",
    )
    search.add_argument("--seed", type=int, default=0)
    search.add_argument("--train-steps", type=int, default=20, help="steps per trial")
    search.add_argument("--batch-size", type=int, default=32)
    search.add_argument(
        "--dtypes", default=None, help="dtypes to consider, e.g. float32,bfloat16 (default: auto)"
    )
    search.add_argument("-o", "--output", default="plan.json")
    search.set_defaults(handler=_command_search)

    show = commands.add_parser("show", help="print a plan or profile as a table")
    show.add_argument("file", help="plan.json or profile.json")
    show.set_defaults(handler=_command_show)

    diff = commands.add_parser("diff", help="compare two plans layer by layer")
    diff.add_argument("first")
    diff.add_argument("second")
    diff.set_defaults(handler=_command_diff)

    hardware = commands.add_parser("hardware", help="list hardware profiles or detect this machine")
    hardware.add_argument("name", nargs="?", help="show one profile in full")
    hardware.add_argument("--detect", action="store_true", help="describe this machine")
    hardware.set_defaults(handler=_command_hardware)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the `autoprec` command and returns its exit code.

    Args:
        argv: arguments without the program name; `sys.argv[1:]` if `None`.

    Returns:
        0 on success, 2 on bad input, 1 on an internal error.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return handler(args)
    except (AutoprecError, json.JSONDecodeError) as error:
        if args.debug:
            traceback.print_exc()
        print(f"autoprec {args.command}: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"autoprec {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # an internal error: say so, keep the details one flag away
        if args.debug:
            traceback.print_exc()
        print(
            f"autoprec {args.command}: internal error: {type(error).__name__}: {error} "
            "(run with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
