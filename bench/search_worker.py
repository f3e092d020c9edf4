"""A search process for fault injection: `python bench/search_worker.py STORAGE N_TRIALS`.

Used by `bench/faults.py` and `tests/test_reliability.py` to kill a search
mid-study (SIGKILL) and resume it on the same storage.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import autoprec  # noqa: E402

STUDY_NAME = "fault_injection"


def main(storage: str, n_trials: int) -> None:
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
    autoprec.search(
        model,
        (x[:192], y[:192]),
        (x[192:], y[192:]),
        budget=autoprec.Budget("val_accuracy", max_drop=0.05),
        hardware="rtx4090",
        n_trials=n_trials,
        storage=storage,
        study_name=STUDY_NAME,
        verbose=0,
        settings=autoprec.SearchSettings(
            dtypes=("float32", "bfloat16", "float16"),
            seed=0,
            steps_per_trial=3,
            batch_size=32,
        ),
    )
    print("finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
