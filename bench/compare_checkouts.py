"""The one-liner's first epoch in two checkouts of autoprec, side by side, rounds interleaved.

Each round runs one fresh process per checkout (the order alternating between rounds); each
process trains a fresh copy of the model twice, without a callback and with
`autoprec.AutoPrecision()` (`bench/oneliner_first_epoch.py`'s `timed_fit`, in the order that
alternates too), and reports the first epoch of both fits, the train functions built and the
model copies cloned while the one-liner decided, and the traces its plan records. The table
gives min and median per checkout and the ratio of the one-liner's first-epoch medians
(new / old), and the same ratio taken against each process's own plain fit (which cancels a
slower or faster process).

```bash
git worktree add /tmp/old <commit>
python bench/compare_checkouts.py --old /tmp/old --new . --models encoder --rounds 5
```
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD_MARKER = "compare-checkouts-result: "


def _child(checkout: Path, model: str, epochs: int, steps: int, plain_first: bool) -> None:
    """Runs one plain and one one-liner fit in this process; prints one JSON line."""
    sys.path.insert(0, str(checkout / "bench"))
    sys.path.insert(0, str(checkout))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import oneliner_first_epoch as bench

    counts = {"clones": 0, "train_functions": 0}
    clone_model = keras.models.clone_model
    make_train_function = keras.Model.make_train_function

    def counted_clone(*args, **kwargs):
        counts["clones"] += 1
        return clone_model(*args, **kwargs)

    def counted_make_train_function(self, *args, **kwargs):
        counts["train_functions"] += 1
        return make_train_function(self, *args, **kwargs)

    keras.models.clone_model = counted_clone
    keras.Model.make_train_function = counted_make_train_function
    keras.utils.set_random_seed(0)
    build, make_data = bench.MODELS[model]
    weights = build().get_weights()
    data = make_data(32 * steps)
    result = {}
    for one_liner in (False, True) if plain_first else (True, False):
        before = dict(counts)
        ends, plan = bench.timed_fit(model, weights, data, epochs, one_liner)
        key = "auto" if one_liner else "plain"
        result[key] = ends[0]
        result[f"{key}_fit"] = ends[-1]
        result[f"{key}_counts"] = {name: counts[name] - before[name] for name in counts}
        if one_liner:
            measured = plan.metadata.get("measured") or {}
            result["traces"] = measured.get("traces")
            result["plan"] = sorted(set(plan.resolve().values()))
    print(CHILD_MARKER + json.dumps(result), flush=True)


def _run(checkout: Path, model: str, epochs: int, steps: int, plain_first: bool) -> dict:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(checkout),
        "--models",
        model,
        "--epochs",
        str(epochs),
        "--steps",
        str(steps),
    ] + (["--plain-first"] if plain_first else [])
    environment = dict(os.environ, PYTHONPATH=str(checkout))
    output = subprocess.run(
        command, capture_output=True, text=True, env=environment, cwd=checkout, check=False
    )
    for line in output.stdout.splitlines():
        if line.startswith(CHILD_MARKER):
            return json.loads(line[len(CHILD_MARKER) :])
    raise RuntimeError(f"{checkout}: no result\n{output.stdout[-2000:]}\n{output.stderr[-4000:]}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, help="the checkout to compare against")
    parser.add_argument("--new", type=Path, default=Path("."))
    parser.add_argument("--models", default="encoder")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--plain-first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child.resolve(), args.models, args.epochs, args.steps, args.plain_first)
        return
    if args.old is None:
        parser.error("--old: give the checkout to compare against")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import host

    print(f"host: {host.cpu_model()}, {host.cores()} cores; load {host.load():.1f}")
    checkouts = {"old": args.old.resolve(), "new": args.new.resolve()}
    for model in args.models.split(","):
        results: dict[str, list[dict]] = {"old": [], "new": []}
        for index in range(args.rounds):
            order = ("old", "new") if index % 2 == 0 else ("new", "old")
            for name in order:
                result = _run(checkouts[name], model, args.epochs, args.steps, index % 2 == 0)
                results[name].append(result)
                print(
                    f"  {model} round {index + 1} {name}: first epoch plain {result['plain']:.2f} s"
                    f", one-liner {result['auto']:.2f} s; while deciding "
                    f"{result['auto_counts']['train_functions']} train functions built, "
                    f"{result['auto_counts']['clones']} clones; traces {result['traces']}; "
                    f"plan {'/'.join(result['plan'])}",
                    flush=True,
                )
        medians = {}
        for name, rows in results.items():
            auto = [row["auto"] for row in rows]
            relative = [row["auto"] / row["plain"] for row in rows]
            medians[name] = (statistics.median(auto), statistics.median(relative))
            print(
                f"{model} {name}: one-liner first epoch min {min(auto):.2f} s / median "
                f"{statistics.median(auto):.2f} s; against its own plain fit min "
                f"{min(relative):.2f}x / median {statistics.median(relative):.2f}x"
            )
        print(
            f"{model} new / old, one-liner first epoch: {medians['new'][0] / medians['old'][0]:.2f}x"
            f" (medians); against each process's plain fit: "
            f"{medians['new'][1] / medians['old'][1]:.2f}x"
        )


if __name__ == "__main__":
    main()
