"""Time a few layers of each kind, and predict the rest of that kind from what they showed."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence

from .._core.dtypes import FLOAT32
from ..hardware import HardwareProfile
from .counting import LayerCost
from .roofline import predicted_layer_seconds


@dataclasses.dataclass(frozen=True)
class KindSample:
    """Which layers of a model `calibrate` times, and which it predicts from them.

    Attributes:
        timed: paths of the layers timed (or read from the cache).
        predicted_from: `{path: class name}` of the layers predicted from the timed
            layers of their kind.
    """

    timed: frozenset[str]
    predicted_from: Mapping[str, str]


def sample_kinds(
    counts: Mapping[str, LayerCost],
    work: Sequence[str],
    per_kind: int | None,
    profile: HardwareProfile,
    batch_size: int,
) -> KindSample:
    """Returns which of `work` to time: up to `per_kind` layers of each class, spread by size.

    Args:
        counts: `{path: LayerCost}` of the model.
        work: paths of the layers that can be timed.
        per_kind: the most layers of one class to time; `None` times every layer.
        profile: the device's profile, for the roofline predictions that rank them.
        batch_size: samples per step.

    Returns:
        A `KindSample`.

    Example:

    ```python
    sample = sample_kinds(counts, list(counts), 2, autoprec.hardware.get("cpu-generic"), 32)
    len(sample.timed)  # at most 2 per layer class
    ```
    """
    if per_kind is None:
        return KindSample(frozenset(work), {})
    by_kind: dict[str, list[str]] = collections.defaultdict(list)
    for path in work:
        by_kind[counts[path].class_name].append(path)
    timed: set[str] = set()
    predicted_from: dict[str, str] = {}
    for kind, paths in by_kind.items():
        ranked = sorted(
            paths,
            key=lambda path: (
                -(predicted_layer_seconds(counts[path], profile, FLOAT32, batch_size) or 0.0)
            ),
        )
        chosen = _spread(ranked, max(per_kind, 1))
        timed.update(chosen)
        predicted_from.update({path: kind for path in ranked if path not in chosen})
    return KindSample(frozenset(timed), predicted_from)


def _spread(ranked: Sequence[str], count: int) -> list[str]:
    """The first of `ranked` and others evenly spaced to its end, `count` in all."""
    if len(ranked) <= count:
        return list(ranked)
    if count == 1:
        return [ranked[0]]
    step = (len(ranked) - 1) / (count - 1)
    return list(dict.fromkeys(ranked[round(index * step)] for index in range(count)))


def kind_scales(
    measured: Mapping[str, Mapping[str, float | None]],
    counts: Mapping[str, LayerCost],
    profile: HardwareProfile,
    batch_size: int,
) -> dict[tuple[str, str], float]:
    """Returns measured over predicted seconds, per `(class name, dtype)`, of the timed layers.

    Args:
        measured: `{path: {dtype: seconds}}` of the layers timed.
        counts: `{path: LayerCost}` of the model.
        profile: the device's profile.
        batch_size: samples per step.

    Returns:
        `{(class name, dtype): scale}` where the predictions are positive.

    Example:

    ```python
    kind_scales({"conv": {"float32": 2e-3}}, counts, profile, 32)  # {("Conv2D", "float32"): 1.7}
    ```
    """
    sums: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for path, seconds in measured.items():
        for dtype, value in seconds.items():
            predicted = predicted_layer_seconds(counts[path], profile, dtype, batch_size)
            if value is None or not predicted:
                continue
            totals = sums[(counts[path].class_name, dtype)]
            totals[0] += value
            totals[1] += predicted
    return {key: total / predicted for key, (total, predicted) in sums.items() if predicted > 0}


def scaled_seconds(
    cost: LayerCost,
    dtypes: Sequence[str],
    scales: Mapping[tuple[str, str], float],
    profile: HardwareProfile,
    batch_size: int,
) -> dict[str, float | None]:
    """Returns a layer's predicted seconds per dtype, scaled as the timed layers of its kind showed.

    Args:
        cost: the layer's counts.
        dtypes: the dtypes to predict.
        scales: from `kind_scales`; a dtype of a kind with no scale keeps the prediction.
        profile: the device's profile.
        batch_size: samples per step.

    Returns:
        `{dtype: seconds or None}` (`None`: the prediction is infeasible).

    Example:

    ```python
    scaled_seconds(counts["conv_7"], ["float32", "bfloat16"], scales, profile, 32)
    ```
    """
    seconds: dict[str, float | None] = {}
    for dtype in dtypes:
        predicted = predicted_layer_seconds(cost, profile, dtype, batch_size)
        scale = scales.get((cost.class_name, dtype), 1.0)
        seconds[dtype] = None if predicted is None else predicted * scale
    return seconds
