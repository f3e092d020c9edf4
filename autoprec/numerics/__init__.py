"""Floating-point format facts and exponent-histogram maths, for every stage above.

Everything here takes plain values (floats, NumPy arrays) and returns plain
values. Format limits come from `ml_dtypes.finfo`, never from hand-typed
constants. Modules, in the order they build on each other:

* `formats`: the range facts of each format (`FloatFormat`, `float_format`,
  `COMPUTE_FORMATS`);
* `histogram`: the exponent histogram of a tensor and the fractions of it that
  overflow, underflow or turn subnormal in a format, at a loss scale;
* `loss_scaling`: headroom below a format's max and the loss scales that fit
  a gradient range;
* `float8_scaling`: what Keras' per-tensor-scaled float8 cast flushes to zero or
  clips, with its delayed scale.

Every name is importable from `autoprec.numerics` itself.
"""

from .float8_scaling import (
    FLOAT8_FLUSH_TOLERANCE,
    FLOAT8_MAX_AMAX_GROWTH,
    FLOAT8_MIN_HISTORY_STEPS,
    FLOAT8_SATURATION_TOLERANCE,
    FLOAT8_SCALE_DELAY_STEPS,
    amax_growth,
    float8_delayed_saturation_fraction,
    float8_flush_fraction,
    float8_saturation_fraction,
    float8_scale,
)
from .formats import (
    BFLOAT16,
    COMPUTE_DTYPES,
    COMPUTE_FORMATS,
    FLOAT8_E4M3,
    FLOAT8_E5M2,
    FLOAT16,
    FLOAT32,
    FORMAT_ALIASES,
    FloatFormat,
    float_format,
    format_for,
)
from .histogram import (
    HISTOGRAM_BINS,
    HISTOGRAM_MAX_EXPONENT,
    HISTOGRAM_MIN_EXPONENT,
    bin_exponents,
    exceeds_max,
    exponent_histogram,
    overflow_fraction,
    subnormal_fraction,
    underflow_fraction,
)
from .loss_scaling import (
    LOSS_SCALE_MARGIN_BITS,
    MAX_LOSS_SCALE,
    MIN_LOSS_SCALE,
    UNDERFLOW_TOLERANCE,
    headroom_bits,
    loss_scale_covers_range,
    required_loss_scale,
    smallest_significant_exponent,
    suggested_loss_scale,
)

__all__ = [
    "BFLOAT16",
    "COMPUTE_DTYPES",
    "COMPUTE_FORMATS",
    "FLOAT8_E4M3",
    "FLOAT8_E5M2",
    "FLOAT8_FLUSH_TOLERANCE",
    "FLOAT8_MAX_AMAX_GROWTH",
    "FLOAT8_MIN_HISTORY_STEPS",
    "FLOAT8_SATURATION_TOLERANCE",
    "FLOAT8_SCALE_DELAY_STEPS",
    "FLOAT16",
    "FLOAT32",
    "FORMAT_ALIASES",
    "HISTOGRAM_BINS",
    "HISTOGRAM_MAX_EXPONENT",
    "HISTOGRAM_MIN_EXPONENT",
    "LOSS_SCALE_MARGIN_BITS",
    "MAX_LOSS_SCALE",
    "MIN_LOSS_SCALE",
    "UNDERFLOW_TOLERANCE",
    "FloatFormat",
    "amax_growth",
    "bin_exponents",
    "exceeds_max",
    "exponent_histogram",
    "float8_delayed_saturation_fraction",
    "float8_flush_fraction",
    "float8_saturation_fraction",
    "float8_scale",
    "float_format",
    "format_for",
    "headroom_bits",
    "loss_scale_covers_range",
    "overflow_fraction",
    "required_loss_scale",
    "smallest_significant_exponent",
    "subnormal_fraction",
    "suggested_loss_scale",
    "underflow_fraction",
]
