"""Merging statistics: one `TensorStats` for several tensors, steps, devices or replicas.

Statistics merge by the rules the backends use to combine steps and replicas:
counts and sums add up, the largest magnitude is the largest of them and the
smallest non-zero magnitude the smallest. `TensorStats.merge` and the merged
views of a `LayerProfile` (`activation`, `forward`, `gradient`, ...) delegate
here; the functions read the statistics through `layout.StatsView` and build
the result with the class they are given, so they sit below `TensorStats`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

import numpy as np

from .layout import StatsView

_Stats = TypeVar("_Stats", bound=StatsView)


def merge_stats(cls: type[_Stats], stats: Iterable[_Stats | None]) -> _Stats | None:
    """Returns the statistics of the union of several tensors, or `None` for none.

    Args:
        cls: the class of the result (`TensorStats`).
        stats: the statistics to merge; `None` items are skipped.

    Returns:
        One `cls` whose counts and sums are the totals of `stats`, or `None`
        when there is nothing to merge.

    Example:

    ```python
    merge_stats(TensorStats, [layer.activations["output/0"], layer.activations["output/1"]])
    ```
    """
    items = [item for item in stats if item is not None]
    if not items:
        return None
    minima = [item.min_nonzero_abs for item in items if item.min_nonzero_abs is not None]
    return cls(
        count=sum(item.count for item in items),
        zeros=sum(item.zeros for item in items),
        nonfinite=sum(item.nonfinite for item in items),
        nan=sum(item.nan for item in items),
        max_abs=max(item.max_abs for item in items),
        min_nonzero_abs=min(minima) if minima else None,
        sum_abs=sum(item.sum_abs for item in items),
        sum_squares=sum(item.sum_squares for item in items),
        histogram=np.sum([item.histogram for item in items], axis=0),
    )


def merge_groups(cls: type[_Stats], *groups: Mapping[str, _Stats]) -> _Stats | None:
    """Returns the statistics of every tensor of some `{name: statistics}` groups together.

    Args:
        cls: the class of the result (`TensorStats`).
        *groups: groups of a `LayerProfile`, e.g. its `activations` and `internals`.

    Returns:
        The merged statistics, or `None` when the groups are empty.

    Example:

    ```python
    merge_groups(TensorStats, layer.activation_gradients, layer.weight_gradients)
    ```
    """
    return merge_stats(cls, (stats for group in groups for stats in group.values()))
