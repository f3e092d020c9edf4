"""The `autoprec` command: parses the command line and runs each command over the library."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import json
import logging
import os
import re
import sys
import tempfile
import traceback
import warnings
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ._core.dtypes import FLOAT16_TRIALS
from ._version import __version__
from .errors import AutoprecError

EXIT_OK = 0
#: A failure: an internal error, or `diff --exit-code` finding differences.
EXIT_INTERNAL = 1
#: A usage error: a flag, a file or a field the user must fix.
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class UsageError(AutoprecError, ValueError):
    """Bad command-line input: a file, field or flag the user must fix."""


def load_keras_model(path: str, require_compiled: bool = True):
    """Loads a `.keras` model (its stored plan re-applied), checking the file first."""
    model_path = Path(path)
    if not model_path.exists():
        raise UsageError(f"{model_path}: no such model file; give a .keras file saved by Keras.")
    if model_path.suffix != ".keras":
        raise UsageError(f"{model_path}: expected a .keras file (model.save('model.keras')).")
    import keras

    from .runtime import load_model

    try:
        with warnings.catch_warnings():
            # A model saved after compile but before fit has an unbuilt optimizer;
            # Keras warns that it skips its (empty) state.
            warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
            model = load_model(model_path)
    except AutoprecError:
        raise
    except Exception as error:  # Keras raises many types for a bad archive
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UsageError(f"{model_path}: cannot load the model: {message}") from None
    if require_compiled and (
        getattr(model, "optimizer", None) is None or not getattr(model, "compiled", False)
    ):
        raise UsageError(
            f"{model_path}: the model is not compiled; save it after model.compile(...) so "
            "autoprec knows its loss, optimizer and metrics."
        )
    keras.utils.set_random_seed(0)
    return model


def load_data(spec: str) -> dict[str, Any]:
    """Loads training and validation data from a `.npz` file or a `module:function` spec."""
    if spec.endswith(".npz"):
        path = Path(spec)
        if not path.exists():
            raise UsageError(f"{path}: no such data file.")
        import numpy

        try:
            arrays = dict(numpy.load(path, allow_pickle=False))
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


def read_json_kind(path: str) -> tuple[str, Any]:
    """Reads a JSON file and says whether it is a `"plan"` or a `"profile"`."""
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


def load_plan(path: str):
    """Loads a precision plan from a plan JSON file or from a `.keras` model saved with one."""
    archive = Path(path)
    if archive.suffix != ".keras":
        from .plan import PrecisionPlan

        kind, data = read_json_kind(path)
        if kind != "plan":
            raise UsageError(f"{path}: this is a {kind}, not a precision plan.")
        return PrecisionPlan.from_dict(data, source=path)
    if not archive.exists():
        raise UsageError(f"{archive}: no such model file.")
    if not zipfile.is_zipfile(archive):
        raise UsageError(f"{archive}: not a .keras archive (not a zip file).")
    from .runtime import load_plan_from_archive

    plan = load_plan_from_archive(archive)
    if plan is None:
        raise UsageError(
            f"{archive}: no precision plan is stored in this model; write one with "
            f"'autoprec export PLAN {archive.name} -o OUT.keras' or autoprec.save_model."
        )
    return plan


def load_profile_for(path: str, model) -> Any:
    """Loads a profile written by `autoprec profile` and checks it was recorded for `model`."""
    from .layers import model_fingerprint
    from .profiler.stats import Profile

    kind, _ = read_json_kind(path)
    if kind != "profile":
        raise UsageError(f"--profile {path}: this is a {kind}, not a profile (autoprec profile).")
    loaded = Profile.load(path)
    fingerprint = model_fingerprint(model)
    if loaded.fingerprint is not None and loaded.fingerprint != fingerprint:
        raise UsageError(
            f"--profile {path}: recorded for another model ({loaded.model_name or 'unnamed'}, "
            f"fingerprint {loaded.fingerprint}, this model has {fingerprint}); "
            "re-run 'autoprec profile' on this model."
        )
    return loaded


def parse_budget(text: str):
    """Parses `METRIC:MAX_DROP` or `METRIC:PERCENT%`, optionally `:min` or `:max`, into a Budget."""
    from .search import Budget

    metric, separator, amount = text.partition(":")
    amount, _, mode = amount.partition(":")
    if not separator or not metric or not amount or mode not in ("", "min", "max"):
        raise UsageError(
            f"--budget {text!r}: use METRIC:MAX_DROP (e.g. val_accuracy:0.005) or "
            "METRIC:PERCENT% for a relative drop (e.g. val_loss:2%), with :min or :max after "
            "it for a metric whose name does not say which way is better (e.g. val_score:0.01:max)."
        )
    try:
        if amount.endswith("%"):
            return Budget(metric, max_relative_drop=float(amount[:-1]) / 100.0, mode=mode or "auto")
        return Budget(metric, max_drop=float(amount), mode=mode or "auto")
    except (ValueError, AutoprecError) as error:
        raise UsageError(f"--budget {text!r}: {error}") from None


def parse_dtypes(text: str | None) -> tuple[str, ...] | None:
    """Parses `--dtypes float32,bf16` into canonical dtype names (`None` when not given)."""
    if not text:
        return None
    from ._core.dtypes import canonical_dtype

    try:
        return tuple(canonical_dtype(item.strip(), "--dtypes") for item in text.split(","))
    except AutoprecError as error:
        raise UsageError(str(error)) from None


def search_keyword_arguments(args: argparse.Namespace, budget, profile) -> dict[str, Any]:
    """Returns the keyword arguments of `autoprec.search` for the `search` command's flags."""
    from .search import SearchSettings

    settings = SearchSettings(
        seed=args.seed, plan_path=args.output, steps_per_trial=args.steps_per_trial,
        validation_steps=args.validation_steps, batch_size=args.batch_size,
        dtypes=parse_dtypes(args.dtypes), float16_trials=args.float16_trials, profile=profile,
    )  # fmt: skip
    arguments = {"budget": budget, "hardware": args.hardware, "n_trials": args.n_trials}
    return {**arguments, "timeout": args.timeout, "verbose": args.verbose, "settings": settings}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the `autoprec` command and returns its exit code."""
    configure_framework_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        with quiet_framework_imports(), autoprec_messages(getattr(args, "verbose", 1)):
            return handler(args)
    except KeyboardInterrupt:
        print(f"autoprec: {args.command} interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:  # a failure: say so, keep the details one flag away
        if args.debug:
            traceback.print_exc()
        if isinstance(error, (AutoprecError, json.JSONDecodeError)):
            print(f"autoprec: error: {_one_line(error)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(
            f"autoprec: error: {args.command} failed: {type(error).__name__}: "
            f"{_one_line(error)} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


class OneLineParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose usage errors are one line: `autoprec: error: ...`, exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
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

    def command(handler: Callable, text: str) -> argparse.ArgumentParser:
        added = subcommands.add_parser(handler.__name__, help=text)
        added.set_defaults(handler=handler)
        return added

    demo_ = command(demo, "profile, search and train a small model; print the results")
    demo_.add_argument("-o", "--output", default="plan.json", help="where to write the plan")
    demo_.add_argument("--quick", action="store_true", help="smaller run (for tests)")
    demo_.add_argument(
        "--n-trials", type=int, default=None, metavar="N", help="search trials (default: auto)"
    )
    demo_.add_argument(
        "--predict-for", default="rtx4090", metavar="NAME",
        help="hardware profile whose step time is predicted beside the measured one "
        "(default rtx4090; 'none' for none)",
    )  # fmt: skip
    demo_.add_argument(
        "--figures", default=None, metavar="PATH", help="also write the figures as JSON here"
    )
    profile_ = command(profile, "record per-layer ranges during training")
    profile_.add_argument("model", help="a compiled model saved as .keras")
    profile_.add_argument("--data", required=True, help="DATA.npz or module:function")
    profile_.add_argument("--steps", type=int, default=20, help="training steps to profile")
    profile_.add_argument("--batch-size", type=int, default=32)
    profile_.add_argument("-o", "--output", default="profile.json")
    _add_search_flags(command(search, "find the fastest plan within an accuracy budget"))
    export_ = command(export, "save a model with a plan applied and stored inside")
    export_.add_argument("plan", help="plan.json (or a .keras model that stores one)")
    export_.add_argument("model", help="the model, saved as .keras")
    export_.add_argument("-o", "--output", required=True, help="the new .keras file")
    show_ = command(show, "print a plan or profile as a table")
    show_.add_argument("file", help="plan.json, profile.json, or a .keras model saved with a plan")
    show_.add_argument("--json", action="store_true", help="print JSON instead of a table")
    diff_ = command(diff, "compare two plans layer by layer")
    diff_.add_argument("first", help="a plan file (or a .keras model that stores one)")
    diff_.add_argument("second", help="the plan to compare it with")
    diff_.add_argument("--json", action="store_true", help="print JSON instead of text")
    diff_.add_argument(
        "--exit-code", action="store_true", help="exit 1 if the plans differ, 0 if identical"
    )
    hardware_ = command(hardware, "list hardware profiles or detect this machine")
    hardware_.add_argument("name", nargs="?", help="show one profile in full")
    hardware_.add_argument("--detect", action="store_true", help="describe this machine")
    hardware_.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser


def _add_search_flags(search_: argparse.ArgumentParser) -> None:
    search_.add_argument("model", help="a compiled model saved as .keras")
    search_.add_argument("--data", required=True, help="DATA.npz or module:function")
    search_.add_argument(
        "--budget", required=True, help="METRIC:MAX_DROP, e.g. val_accuracy:0.005, or val_loss:2%%"
    )
    search_.add_argument("--hardware", default="local", help="local, or a profile name (rtx4090)")
    search_.add_argument("--n-trials", type=int, default=20, metavar="N", help="trials to run")
    search_.add_argument("--timeout", type=float, default=None, help="seconds")
    search_.add_argument(
        "--profile", default=None, metavar="FILE", help="reuse a profile from 'autoprec profile'"
    )
    search_.add_argument("--storage", default=None, help="Optuna storage URL or journal file")
    search_.add_argument("--study-name", default=None)
    search_.add_argument(
        "--workers", type=int, default=1,
        help="local processes searching one study (a journal file next to -o by default)",
    )  # fmt: skip
    search_.add_argument("--seed", type=int, default=0)
    search_.add_argument(
        "--steps-per-trial", type=int, default=20, metavar="S", help="training steps per trial"
    )
    search_.add_argument(
        "--validation-steps", type=int, default=None, metavar="N",
        help="validation batches per evaluation (default: all)",
    )  # fmt: skip
    search_.add_argument("--batch-size", type=int, default=32)
    search_.add_argument(
        "--dtypes", default=None, help="dtypes to consider, e.g. float32,bfloat16 (default: auto)"
    )
    search_.add_argument(
        "--float16-trials", choices=FLOAT16_TRIALS, default="auto",
        help="train float16 natively or emulated (float32 math, float16 rounding); "
        "default: emulated where float16 has no fast kernels here",
    )  # fmt: skip
    search_.add_argument(
        "--verbose", type=_verbose, default=1, metavar="{0,1,2}",
        help="0 silent, 1 one line per trial (default), 2 more detail",
    )  # fmt: skip
    search_.add_argument("-o", "--output", default="plan.json")


def print_json(data: Any) -> None:
    """Prints `data` as indented JSON (the `--json` output of every command)."""
    print(json.dumps(data, indent=2, default=str))


def diff_to_dict(first: str, second: str, difference) -> dict[str, Any]:
    """Returns the `diff --json` object for a `PlanDiff` between two files."""
    default, rules = difference.default_changed, difference.rules_changed
    return {
        "first": first,
        "second": second,
        "identical": not difference,
        "default": default and {"first": default[0], "second": default[1]},
        "changed": [
            {"layer": path, "first": before, "second": after}
            for path, before, after in difference.changed
        ],
        "only_in_first": list(difference.only_in_self),
        "only_in_second": list(difference.only_in_other),
        "rules": rules
        and {
            side: [rule.to_dict() for rule in part]
            for side, part in zip(("first", "second"), rules)
        },
    }


def show(args: argparse.Namespace) -> int:
    """`autoprec show FILE`: a plan, a profile, or the plan stored in a `.keras` model."""
    from .profiler.stats import Profile

    kind = "plan" if Path(args.file).suffix == ".keras" else read_json_kind(args.file)[0]
    loaded = load_plan(args.file) if kind == "plan" else Profile.load(args.file)
    if args.json:
        print_json({"kind": kind, "source": args.file, kind: loaded.to_dict()})
    else:
        print(loaded.summary())
    return EXIT_OK


def diff(args: argparse.Namespace) -> int:
    """`autoprec diff FIRST SECOND`: what the second plan assigns differently."""
    difference = load_plan(args.first).diff(load_plan(args.second))
    if args.json:
        print_json(diff_to_dict(args.first, args.second, difference))
    else:
        print(f"--- {args.first}\n+++ {args.second}")
        print(difference)
    return EXIT_INTERNAL if args.exit_code and difference else EXIT_OK


def hardware(args: argparse.Namespace) -> int:
    """`autoprec hardware [NAME] [--detect]`: the built-in profiles, one of them, or this machine."""
    if args.detect and args.name:
        raise UsageError(f"hardware: give NAME ({args.name!r}) or --detect, not both.")
    from .hardware import detect, get, names

    if args.detect or args.name:
        found = detect() if args.detect else get(args.name)
        print_json({"profile": found.to_dict()}) if args.json else print(found.summary())
        return EXIT_OK
    listed = [get(name) for name in names()]
    if args.json:
        print_json({"profiles": [entry.to_dict() for entry in listed]})
        return EXIT_OK
    for entry in listed:
        fast = ", ".join(dtype for dtype in ("bfloat16", "float16") if entry.is_fast(dtype))
        print(f"{entry.name:<22} {entry.kind:<4} fast 16-bit: {fast or 'none'}")
    return EXIT_OK


def profile(args: argparse.Namespace) -> int:
    """`autoprec profile MODEL --data DATA`: per-layer ranges over a few training steps."""
    model = load_keras_model(args.model)
    data = load_data(args.data)
    from .profiler.runner import profile as record_profile

    result = record_profile(model, data["train"], steps=args.steps, batch_size=args.batch_size)
    result.save(args.output)
    print(result.summary())
    print(f"profile written to {args.output}")
    return EXIT_OK


def search(args: argparse.Namespace) -> int:
    """`autoprec search MODEL --data DATA --budget METRIC:DROP`: the cheapest plan within budget."""
    if args.workers < 1:
        raise UsageError(f"--workers {args.workers}: give at least 1 process.")
    if args.n_trials < 1:
        raise UsageError(f"--n-trials {args.n_trials}: give at least 1 trial.")
    budget = parse_budget(args.budget)
    parse_dtypes(args.dtypes)  # a bad --dtypes fails before the model is loaded
    model = load_keras_model(args.model)
    loaded_profile = load_profile_for(args.profile, model) if args.profile else None
    data = load_data(args.data)
    from .search import search as run_search
    from .search import search_in_processes

    arguments = search_keyword_arguments(args, budget, loaded_profile)
    if args.workers > 1:
        storage = args.storage or f"{args.output}.search.log"
        result = search_in_processes(
            args.workers, model, data["train"], data["val"], storage=storage,
            study_name=args.study_name or "autoprec", **arguments,
        )  # fmt: skip
    else:
        result = run_search(
            model, data["train"], data["val"], storage=args.storage,
            study_name=args.study_name, **arguments,
        )  # fmt: skip
    result.plan.save(args.output)
    print(result.report())
    print(f"plan written to {args.output}")
    return EXIT_OK


def export(args: argparse.Namespace) -> int:
    """`autoprec export PLAN MODEL -o OUT.keras`: the model with the plan applied and stored."""
    if not str(args.output).endswith(".keras"):
        raise UsageError(f"-o {args.output}: the output must end in '.keras'.")
    plan = load_plan(args.plan)
    model = load_keras_model(args.model, require_compiled=False)
    from .errors import PlanError
    from .runtime import apply_plan, save_model

    try:
        handle = apply_plan(model, plan, strict=True)
    except PlanError as error:
        reason = str(error).replace(", or pass strict=False to apply what matches", "")
        raise UsageError(f"{args.plan} does not fit {args.model}: {reason}") from None
    save_model(model, args.output, plan=handle.plan)
    print(f"model with plan {args.plan} written to {args.output}")
    return EXIT_OK


def demo(args: argparse.Namespace) -> int:
    """`autoprec demo`: profile, search, train and time the built-in model."""
    from .demo import run_demo

    predict_for = None if str(args.predict_for).lower() == "none" else args.predict_for
    run_demo(
        args.output, args.quick, args.n_trials, predict_for=predict_for, figures_path=args.figures
    )
    return EXIT_OK


#: Python loggers of the framework, silenced below ERROR before it is imported.
FRAMEWORK_LOGGERS = ("tensorflow", "absl", "jax", "jax._src.xla_bridge")
#: Top-level modules whose first import runs with the native start-up lines filtered.
FRAMEWORK_MODULES = ("keras", "tensorflow")
#: Lines the framework's native code writes while it loads (absl/glog format and banners).
NATIVE_NOISE = re.compile(
    r"^(?:[IWE]\d{4} \S+ +\d+ \S+:\d+\] "  # I0000 00:00:1796126097.36 9681 port.cc:153] ...
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|To enable the following instructions:"
    r"|WARNING: Logging before InitGoogleLogging\(\))"
)


def configure_framework_logging() -> None:
    """Asks TensorFlow (and absl) to log errors only; call before the framework is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for name in FRAMEWORK_LOGGERS:
        framework_logger = logging.getLogger(name)
        if framework_logger.level < logging.ERROR:
            framework_logger.setLevel(logging.ERROR)


@contextlib.contextmanager
def quiet_framework_imports() -> Iterator[None]:
    """Drops the framework's native start-up lines from stderr while a command runs."""
    configure_framework_logging()
    finder = _QuietFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)


class _QuietFinder(importlib.abc.MetaPathFinder):
    """Finds Keras and TensorFlow with the other finders and wraps their loaders."""

    def find_spec(self, name, path=None, target=None):
        if name not in FRAMEWORK_MODULES:
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or find_spec is None:
                continue
            spec = find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _QuietLoader(spec.loader)
                return spec
        return None


class _QuietLoader(importlib.abc.Loader):
    """Runs the real loader's `exec_module` with native stderr filtered."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = self._loader  # the module keeps its real loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        with _native_stderr_filtered():
            self._loader.exec_module(module)

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


@contextlib.contextmanager
def _native_stderr_filtered() -> Iterator[None]:
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no file descriptor 2 to redirect
        yield
        return
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            written = capture.read().decode("utf-8", errors="replace")
            kept = [line for line in written.splitlines() if not NATIVE_NOISE.match(line)]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")
                sys.stderr.flush()


@contextlib.contextmanager
def autoprec_messages(verbose: int = 1) -> Iterator[None]:
    """Shows the `autoprec` logger's messages on stderr for the duration of a command."""
    package_logger = logging.getLogger("autoprec")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    previous_level = package_logger.level
    package_logger.addHandler(handler)
    package_logger.setLevel(level)
    try:
        yield
    finally:
        package_logger.removeHandler(handler)
        package_logger.setLevel(previous_level)


if __name__ == "__main__":  # `python -m autoprec.cli`
    sys.exit(main())
