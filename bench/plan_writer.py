"""A process that saves plans in a loop, for kill tests: `python bench/plan_writer.py PATH`.

Prints `ready` once, then saves three large plans in turn until killed. Used by
`bench/faults.py` and `tests/test_saving.py` to SIGKILL a save mid-way.
"""

from __future__ import annotations

import sys

from autoprec import PrecisionPlan


def main(path: str) -> None:
    layers = {f"block_{i}/dense_{j}": "bfloat16" for i in range(200) for j in range(20)}
    plans = [PrecisionPlan(layers, default=dtype) for dtype in ("float32", "bfloat16", "float16")]
    print("ready", flush=True)
    index = 0
    while True:
        plans[index % 3].save(path)
        index += 1


if __name__ == "__main__":
    main(sys.argv[1])
