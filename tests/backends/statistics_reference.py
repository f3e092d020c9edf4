"""A NumPy reference for the backends' raw tensor statistics, written another way (`np.frexp`).

Both backends count float32 values by exponent from their bit patterns; this
reference takes each value's exponent from `np.frexp` in float64 instead, and
sums in float64, so the backends are checked against an independent derivation.
"""

from __future__ import annotations

import numpy as np

#: The raw count layout of both backends: 256 biased exponents (0: zeros, 255:
#: non-finite), 23 subnormal exponents (-149 .. -127), then the NaNs.
COUNT_SLOTS = 280

#: Values with every special case: zeros of both signs, inf, NaN, subnormals,
#: values next to powers of two, float16's limits and magnitudes whose squares
#: overflow float32.
SPECIAL = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, 0.99999994, -(2.0**-14), 6.0e-8, 1e-40]
    + [-1.4e-45, 3e30, 65504.0, 70000.0, 3e38, -3e38, 0.25, -3.0],
    np.float32,
)


def reference_statistics(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Returns `(counts, floats)` of float32 values as the backends should measure them.

    `floats` is `[max |x|, min non-zero |x|, sum |x|, sum x^2]` over the finite
    values (float64), `inf` as the minimum where no finite value is non-zero.
    """
    magnitude = np.abs(np.asarray(values, np.float32).ravel()).astype(np.float64)
    finite = np.isfinite(magnitude)
    nonzero = finite & (magnitude > 0)
    counts = np.zeros(COUNT_SLOTS, np.int64)
    counts[0] = np.count_nonzero(finite & (magnitude == 0))
    counts[255] = np.count_nonzero(~finite)
    counts[279] = np.count_nonzero(np.isnan(magnitude))
    exponent = np.frexp(magnitude[nonzero])[1] - 1  # floor(log2 |x|)
    normal = exponent >= -126
    np.add.at(counts, exponent[normal] + 127, 1)
    np.add.at(counts, 256 + exponent[~normal] + 149, 1)
    kept = magnitude[finite]
    floats = np.array(
        [
            kept.max() if kept.size else 0.0,
            magnitude[nonzero].min() if nonzero.any() else np.inf,
            kept.sum(),
            np.square(kept).sum(),
        ]
    )
    return counts, floats
