"""Search a plan for an RTX 4060 Ti from this machine, export it, re-apply it to a fresh model.

Costs for the GPU are predicted from its hardware profile (no GPU needed); the plan is
then compared with the one searched on this machine's own measured costs.

Run: python examples/search_and_export.py [--smoke]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

import autoprec  # noqa: E402
from autoprec import demo  # noqa: E402


def search_for(hardware: str, train, val, n_trials: int, steps: int, dtypes=None):
    """Returns the best plan for `hardware` on the demo model."""
    model = demo.build_model()
    result = autoprec.search(
        model,
        train,
        val,
        budget=autoprec.Budget("val_accuracy", max_drop=0.02),
        hardware=hardware,
        n_trials=n_trials,
        verbose=0,
        settings=autoprec.SearchSettings(
            steps_per_trial=steps,
            batch_size=128,
            dtypes=dtypes,
            measure_speedup=False,
        ),
    )
    print(result.report())
    return result.plan


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny run for tests")
    args = parser.parse_args(argv)
    tf.get_logger().setLevel("ERROR")  # every policy is traced on purpose
    samples, trials, steps = (768, 4, 4) if args.smoke else (4096, 12, 20)
    train, val = demo.make_data(samples), demo.make_data(samples // 4, seed=1)

    gpu_plan = search_for("rtx4060ti-8gb", train, val, trials, steps)
    gpu_plan.save("plan_rtx4060ti.json")
    print("exported plan_rtx4060ti.json")

    fresh = demo.build_model(seed=1)
    reloaded = autoprec.PrecisionPlan.load("plan_rtx4060ti.json")
    handle = autoprec.apply_plan(fresh, reloaded)
    print("re-applied to a fresh model:", reloaded.dtype_counts())
    handle.restore()
    fresh.fit(
        *train,
        epochs=1,
        batch_size=128,
        verbose=0,
        callbacks=[autoprec.AutoPrecision(reloaded, verbose=0)],
    )

    cpu_plan = search_for("local", train, val, trials, steps, dtypes=["float32", "bfloat16"])
    print("this CPU -> RTX 4060 Ti:")
    print(cpu_plan.diff(gpu_plan))


if __name__ == "__main__":
    main()
