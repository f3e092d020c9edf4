"""Merging statistics: one `TensorStats` for several tensors, steps, devices or replicas."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

import numpy as np

from .layout import StatsView

_Stats = TypeVar("_Stats", bound=StatsView)


def merge_stats(cls: type[_Stats], stats: Iterable[_Stats | None]) -> _Stats | None:
    """Returns the statistics of the union of several tensors, or `None` for none."""
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
    """Returns the statistics of every tensor of some `{name: statistics}` groups together."""
    return merge_stats(cls, (stats for group in groups for stats in group.values()))
