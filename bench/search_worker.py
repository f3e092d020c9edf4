"""One search process on a shared storage: `python bench/search_worker.py STORAGE N_TRIALS [options]`.

Used by `bench/faults.py`, `tests/search/test_resume.py` (kill a search mid-study
with SIGKILL, resume it on the same storage) and `tests/search/test_study.py` /
`tests/search/test_postgres.py` (several such processes searching one study on a
journal file or a PostgreSQL server). The model is a small MLP on fixed data, so
that every process searches the same problem.

Options: `--study-name` (default `fault_injection`), `--seed`, `--plan-path` (the
best plan so far is written there), `--dtypes` (comma-separated), `--train-steps`,
`--heartbeat-interval` / `--grace-period` (seconds; database storages), and
`--confirm-steps`.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import autoprec  # noqa: E402
from autoprec.search import SearchResult, resolve_storage  # noqa: E402

STUDY_NAME = "fault_injection"


def build_problem() -> tuple[keras.Model, tuple, tuple]:
    """Returns `(compiled model, train (x, y), validation (x, y))`, the same in every process."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(2, activation="softmax"),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model, (x[:192], y[:192]), (x[192:], y[192:])


def run_search(
    model: keras.Model,
    train: tuple,
    validation: tuple,
    *,
    storage: object,
    study_name: str,
    n_trials: int,
    seed: int,
    dtypes: tuple[str, ...],
    train_steps: int,
    plan_path: str | None = None,
    confirm_steps: int | None = None,
) -> SearchResult:
    """Runs `autoprec.search` with this worker's settings (the one place that spells its arguments)."""
    return autoprec.search(
        model,
        train,
        validation,
        budget=autoprec.Budget("val_accuracy", max_drop=0.05),
        hardware="rtx4090",
        n_trials=n_trials,
        storage=storage,
        study_name=study_name,
        verbose=0,
        settings=autoprec.SearchSettings(
            dtypes=dtypes,
            seed=seed,
            steps_per_trial=train_steps,
            batch_size=32,
            plan_path=plan_path,
            confirm_steps=confirm_steps,
        ),
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("storage")
    parser.add_argument("n_trials", type=int)
    parser.add_argument("--study-name", default=STUDY_NAME)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plan-path", default=None)
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--train-steps", type=int, default=3)
    parser.add_argument("--heartbeat-interval", type=int, default=60)
    parser.add_argument("--grace-period", type=int, default=None)
    parser.add_argument("--confirm-steps", type=int, default=None)
    args = parser.parse_args(argv)
    model, train, validation = build_problem()
    storage = resolve_storage(
        args.storage, heartbeat_interval=args.heartbeat_interval, grace_period=args.grace_period
    )
    run_search(
        model,
        train,
        validation,
        storage=storage,
        study_name=args.study_name,
        n_trials=args.n_trials,
        seed=args.seed,
        dtypes=tuple(args.dtypes.split(",")),
        train_steps=args.train_steps,
        plan_path=args.plan_path,
        confirm_steps=args.confirm_steps,
    )
    print("finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
