"""What the commands read: models, data, plans, profiles, budgets and dtypes, checked."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

from ..errors import AutoprecError

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

    from ..runtime import load_model

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
    from .._core.io import read_json_file

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
        from ..plan import PrecisionPlan

        kind, data = read_json_kind(path)
        if kind != "plan":
            raise UsageError(f"{path}: this is a {kind}, not a precision plan.")
        return PrecisionPlan.from_dict(data, source=path)
    if not archive.exists():
        raise UsageError(f"{archive}: no such model file.")
    if not zipfile.is_zipfile(archive):
        raise UsageError(f"{archive}: not a .keras archive (not a zip file).")
    from ..runtime import load_plan_from_archive

    plan = load_plan_from_archive(archive)
    if plan is None:
        raise UsageError(
            f"{archive}: no precision plan is stored in this model; write one with "
            f"'autoprec export PLAN {archive.name} -o OUT.keras' or autoprec.save_model."
        )
    return plan


def load_profile_for(path: str, model) -> Any:
    """Loads a profile written by `autoprec profile` and checks it was recorded for `model`."""
    from ..layers import model_fingerprint
    from ..profiler.stats import Profile

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
    from ..search import Budget

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
    from .._core.dtypes import canonical_dtype

    try:
        return tuple(canonical_dtype(item.strip(), "--dtypes") for item in text.split(","))
    except AutoprecError as error:
        raise UsageError(str(error)) from None


def search_keyword_arguments(args: argparse.Namespace, budget, profile) -> dict[str, Any]:
    """Returns the keyword arguments of `autoprec.search` for the `search` command's flags."""
    from ..search import SearchSettings

    return {
        "budget": budget,
        "hardware": args.hardware,
        "n_trials": args.n_trials,
        "timeout": args.timeout,
        "verbose": args.verbose,
        "settings": SearchSettings(
            seed=args.seed,
            plan_path=args.output,
            steps_per_trial=args.steps_per_trial,
            validation_steps=args.validation_steps,
            batch_size=args.batch_size,
            dtypes=parse_dtypes(args.dtypes),
            float16_trials=args.float16_trials,
            profile=profile,
        ),
    }
