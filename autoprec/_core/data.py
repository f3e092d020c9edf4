"""One adapter for the data every stage accepts: arrays, `tf.data` datasets, generators, PyDatasets."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

import keras
import numpy as np

from ..errors import AutoprecError


def is_array(value: Any) -> bool:
    """Returns whether `value` is an array or tensor (has a shape and a dtype), not a class."""
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, type)


def flat_arrays(value: Any) -> list:
    """Returns the arrays in a nested structure (dicts, lists, tuples), in order."""
    if is_array(value):
        return [value]
    if isinstance(value, Mapping):
        return [array for item in value.values() for array in flat_arrays(item)]
    if isinstance(value, (list, tuple)):
        return [array for item in value for array in flat_arrays(item)]
    return []


def is_dataset(data: Any) -> bool:
    """Returns whether `data` is a `tf.data.Dataset` (without importing TensorFlow)."""
    return type(data).__module__.startswith("tensorflow") and hasattr(data, "cardinality")


def is_array_tuple(data: Any) -> bool:
    """Returns whether `data` is `(x, y)` or `(x, y, sample_weight)` of (nested) arrays."""
    return (
        isinstance(data, (tuple, list))
        and 2 <= len(data) <= 3
        and not is_array(data)
        and not is_dataset(data)
        and bool(flat_arrays(data[0]))
        and is_array(flat_arrays(data[0])[0])
    )


def input_part(batch: Any) -> Any:
    """Returns the model-input part of a batch: `x` of `(x, y)` / `(x, y, w)`, else `batch`."""
    if is_dataset(batch) or (hasattr(batch, "__iter__") and hasattr(batch, "__next__")):
        batch = next(iter(batch))
    return batch[0] if isinstance(batch, tuple) and len(batch) in (1, 2, 3) else batch


def target_part(batch: Any) -> Any:
    """Returns `y` of an `(x, y)` / `(x, y, w)` tuple, else `None` (a list is inputs only)."""
    return batch[1] if isinstance(batch, tuple) and len(batch) in (2, 3) else None


def slice_batch(inputs: Any, count: int) -> Any:
    """Returns the first `count` samples of every array in a nested structure."""
    if is_array(inputs):
        return inputs[:count]
    if isinstance(inputs, Mapping):
        return {key: slice_batch(value, count) for key, value in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(slice_batch(value, count) for value in inputs)
    return inputs


def batch_size_of(inputs: Any, error_class: type[Exception] = AutoprecError) -> int:
    """Returns the leading dimension of the first array in `inputs`."""
    arrays = flat_arrays(inputs)
    if not arrays:
        raise error_class(
            "the batch holds no arrays; pass `x` or `(x, y)` with NumPy or tensor arrays."
        )
    return int(arrays[0].shape[0])


def _array_batches(data: Any, batch_size: int) -> Iterator[tuple]:
    x, y = data[0], data[1]
    count = batch_size_of(y if flat_arrays(y) else x)
    for start in range(0, count, batch_size):
        yield keras.tree.map_structure(lambda a, s=start: np.asarray(a[s : s + batch_size]), (x, y))


def _element_batches(data: Any, what: str, error_class: type[Exception]) -> Iterator[tuple]:
    elements = (
        (data[index] for index in range(len(data)))
        if isinstance(data, keras.utils.PyDataset)
        else data
    )
    for element in elements:
        if not isinstance(element, (tuple, list)) or len(element) < 2:
            raise error_class(f"{what} must yield (x, y) pairs; got {type(element).__name__}.")
        yield keras.tree.map_structure(np.asarray, (element[0], element[1]))


def take_batches(
    data: Any,
    batch_size: int,
    steps: int | None,
    what: str,
    error_class: type[Exception] = AutoprecError,
) -> list[tuple]:
    """Returns up to `steps` `(x, y)` NumPy batches from any supported data."""
    if is_array_tuple(data):
        batches: Iterator[tuple] = _array_batches(data, batch_size)
    elif is_dataset(data) or isinstance(data, keras.utils.PyDataset) or hasattr(data, "__iter__"):
        batches = _element_batches(data, what, error_class)
    else:
        raise error_class(
            f"{what} must be an (x, y) tuple of arrays, a tf.data.Dataset, a "
            f"keras.utils.PyDataset or a generator of (x, y) batches; got {type(data).__name__}."
        )
    taken = list(itertools.islice(batches, steps))
    if not taken:
        raise error_class(f"{what} holds no batch.")
    return taken


def concatenate_batches(batches: list[tuple]) -> tuple[Any, Any]:
    """Returns `(x, y)` with the batches' arrays joined along the first axis."""
    joined = [
        keras.tree.map_structure(lambda *arrays: np.concatenate(arrays, axis=0), *part)
        for part in ([batch[0] for batch in batches], [batch[1] for batch in batches])
    ]
    return joined[0], joined[1]


def _chain_first(first: Any, rest: Iterator) -> Iterator:
    """A generator of `first` then `rest`: Keras' `fit` accepts generators, not other iterators."""
    yield first
    yield from rest


def fit_arguments(
    data: Any, steps: int, batch_size: int, what: str, error_class: type[Exception] = AutoprecError
) -> tuple[dict[str, Any], Any]:
    """Returns `(model.fit keyword arguments for at least `steps` steps, sample inputs)`."""
    if is_dataset(data):
        cardinality = int(data.cardinality())
        sample = next(iter(data.take(1)), None)
        if sample is None:
            raise error_class(f"{what}: the dataset is empty.")
        if cardinality > 0:
            return {"x": data, "epochs": math.ceil(steps / cardinality)}, input_part(sample)
        return {"x": data, "epochs": 1, "steps_per_epoch": steps}, input_part(sample)
    if isinstance(data, (tuple, list)) and 2 <= len(data) <= 3 and not is_array(data):
        if not is_array_tuple(data):
            raise error_class(
                f"{what}: a tuple of data must hold arrays: (x, y) or (x, y, sample_weight)."
            )
        x = data[0]
        batches = max(1, math.ceil(batch_size_of(x) / batch_size))
        arguments = {
            "x": x,
            "y": data[1],
            "batch_size": batch_size,
            "epochs": math.ceil(steps / batches),
            "shuffle": False,
        }
        if len(data) == 3:
            arguments["sample_weight"] = data[2]
        return arguments, slice_batch(x, batch_size)
    if isinstance(data, Iterator):
        first = next(data, None)
        if first is None:
            raise error_class(f"{what}: the generator yielded no batch.")
        chained = _chain_first(first, data)
        return {"x": chained, "epochs": 1, "steps_per_epoch": steps}, input_part(first)
    if isinstance(data, keras.utils.PyDataset):
        return {"x": data, "epochs": 1, "steps_per_epoch": steps}, input_part(data[0])
    raise error_class(
        f"{what}: unsupported data of type {type(data).__name__}; pass a "
        "tf.data.Dataset, an (x, y) tuple of arrays, a generator or a keras.utils.PyDataset."
    )
