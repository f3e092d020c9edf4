"""The commands: each reads its inputs, calls the library, prints text or JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .inputs import (
    EXIT_INTERNAL,
    EXIT_OK,
    UsageError,
    is_model_archive,
    load_data,
    load_keras_model,
    load_plan,
    load_plan_from_model,
    load_profile_for,
    parse_budget,
    parse_dtypes,
    read_json_kind,
    search_keyword_arguments,
)


def print_json(data: Any) -> None:
    """Prints `data` as indented JSON (the `--json` output of every command)."""
    print(json.dumps(data, indent=2, default=str))


def diff_to_dict(first: str, second: str, difference) -> dict[str, Any]:
    """Returns the `diff --json` object for a `PlanDiff` between two files."""
    default = difference.default_changed
    return {
        "first": first,
        "second": second,
        "identical": not difference,
        "default": None if default is None else {"first": default[0], "second": default[1]},
        "changed": [
            {"layer": path, "first": before, "second": after}
            for path, before, after in difference.changed
        ],
        "only_in_first": list(difference.only_in_self),
        "only_in_second": list(difference.only_in_other),
        "rules": None
        if difference.rules_changed is None
        else {
            "first": [rule.to_dict() for rule in difference.rules_changed[0]],
            "second": [rule.to_dict() for rule in difference.rules_changed[1]],
        },
    }


def show(args: argparse.Namespace) -> int:
    """`autoprec show FILE`: a plan, a profile, or the plan stored in a `.keras` model."""
    if is_model_archive(args.file):
        plan = load_plan_from_model(args.file)
        kind, data = "plan", None
    else:
        kind, data = read_json_kind(args.file)
    if kind == "plan":
        from ..plan import PrecisionPlan

        loaded = plan if data is None else PrecisionPlan.from_dict(data, source=args.file)
    else:
        from ..profiler.stats import Profile

        loaded = Profile.from_dict(data, source=args.file)
    if args.json:
        print_json({"kind": kind, "source": args.file, kind: loaded.to_dict()})
    else:
        print(loaded.summary())
    return EXIT_OK


def diff(args: argparse.Namespace) -> int:
    """`autoprec diff FIRST SECOND`: what the second plan assigns differently."""
    first, second = load_plan(args.first), load_plan(args.second)
    difference = first.diff(second)
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
    from ..hardware import detect, get, names

    if args.detect or args.name:
        found = detect() if args.detect else get(args.name)
        if args.json:
            print_json({"profile": found.to_dict()})
        else:
            print(found.summary())
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
    from ..profiler.runner import profile as record_profile

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
    from ..search import search as run_search
    from ..search import search_in_processes

    arguments = search_keyword_arguments(args, budget, loaded_profile)
    if args.workers > 1:
        result = search_in_processes(
            args.workers,
            model,
            data["train"],
            data["val"],
            storage=args.storage or f"{args.output}.search.log",
            study_name=args.study_name or "autoprec",
            **arguments,
        )
    else:
        result = run_search(
            model,
            data["train"],
            data["val"],
            storage=args.storage,
            study_name=args.study_name,
            **arguments,
        )
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
    from ..errors import PlanError
    from ..runtime import apply_plan, save_model

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
    from ..demo import run_demo

    predict_for = None if str(args.predict_for).lower() == "none" else args.predict_for
    run_demo(
        output=args.output,
        quick=args.quick,
        n_trials=args.n_trials,
        predict_for=predict_for,
        figures_path=args.figures,
    )
    return EXIT_OK
