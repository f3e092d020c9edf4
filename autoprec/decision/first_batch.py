"""`FirstBatchSize`: reads the batch size (and input shapes) `fit` trains with, from inside the
train step."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import keras

from .. import cost
from .._core.data import input_part
from .._core.models import rebuild_train_function, strategy_scope, swap_attribute
from ..errors import PlanError

logger = logging.getLogger("autoprec")

#: Input dimensions besides the batch that a traced TensorFlow step leaves unknown
#: (a padded sequence length) and `FirstBatchSize` records when the step runs.
RECORDED_DIMENSIONS = 63


class FirstBatchSize:
    """Reads the size of the first batch a model trains on, from inside its train step."""

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        self._static: int | None = None
        self._variable: keras.Variable | None = None
        self._inputs: Any = None  # the first batch's input specs; False: unreadable
        self._dimensions: keras.Variable | None = None
        self._undo: Callable[[], None] | None = None

    def install(self) -> None:
        """Wraps the train step and rebuilds the train function so the next step records."""
        if keras.backend.backend() == "tensorflow":
            with strategy_scope(self.model):
                self._variable = keras.Variable(
                    0,
                    dtype="int32",
                    trainable=False,
                    aggregation="only_first_replica",
                    name="autoprec_first_batch_size",
                )
                self._dimensions = keras.Variable(
                    keras.ops.zeros((RECORDED_DIMENSIONS + 1,), "int32"),
                    dtype="int32",
                    trainable=False,
                    aggregation="only_first_replica",
                    name="autoprec_first_batch_dimensions",
                )
        original = self.model.train_step
        reader = self

        def train_step(*args):
            reader._observe(args[-1])
            return original(*args)

        self._undo = swap_attribute(self.model, "train_step", train_step)
        rebuild_train_function(self.model)

    def remove(self) -> None:
        """Puts the model's own train step back; the train function must be rebuilt after."""
        if self._undo is not None:
            self._undo()
            self._undo = None

    def read(self) -> int | None:
        """Returns the first batch's size, or `None` when no step has run yet."""
        if self._static is not None:
            return self._static
        if self._variable is not None:
            value = int(keras.ops.convert_to_numpy(self._variable.value))
            return value or None
        return None

    def read_inputs(self, batch_size: int | None = None) -> Any:
        """Returns random inputs shaped as the first batch's (structure, dtypes, dimensions)."""
        size = batch_size or self.read()
        if self._inputs is None or self._inputs is False or size is None:
            return None
        specs = self._inputs
        if self._dimensions is not None:
            recorded = [int(v) for v in keras.ops.convert_to_numpy(self._dimensions.value)]
            if recorded[0]:
                specs = _with_dimensions(specs, iter(recorded[1:]))
        try:
            return cost.random_inputs(specs, size)
        except PlanError as error:
            logger.info("autoprec: the first batch's shapes are unknown (%s)", error)
            return None

    def _write_dimensions(self, inputs: Any) -> None:
        """Has the traced step write, once, the dimensions the recorded specs leave unknown."""
        specs, arrays = keras.tree.flatten(self._inputs), keras.tree.flatten(inputs)
        if self._dimensions is None or len(specs) != len(arrays):
            return
        unknown = [
            keras.ops.shape(array)[axis]
            for spec, array in zip(specs, arrays)
            for axis, dim in enumerate(spec.shape)
            if axis > 0 and dim is None
        ][:RECORDED_DIMENSIONS]
        if unknown:
            written = keras.ops.stack([keras.ops.cast(dim, "int32") for dim in [1, *unknown]])
            written = keras.ops.pad(written, [[0, RECORDED_DIMENSIONS - len(unknown)]])
            current = self._dimensions.value
            first = keras.ops.equal(current[0], 0)
            self._dimensions.assign(keras.ops.where(first, written, current))

    def _observe(self, data: Any) -> None:
        arrays = [
            value for value in keras.tree.flatten(data) if len(getattr(value, "shape", ())) > 0
        ]
        if not arrays:
            return
        try:
            # Every trace of the step writes the dimensions the first one left unknown.
            if self._inputs is None:
                self._inputs = keras.tree.map_structure(cost.spec_of, input_part(data))
            if self._inputs is not False:
                self._write_dimensions(input_part(data))
        except Exception as error:  # noqa: BLE001 - reading shapes must never stop training
            logger.info("autoprec: the first batch's shapes could not be read (%s)", error)
            self._inputs = False
        size = arrays[0].shape[0]
        if isinstance(size, int):
            if self._static is None:
                self._static = size
        elif self._variable is not None:
            size = keras.ops.cast(keras.ops.shape(arrays[0])[0], "int32")
            current = self._variable.value
            self._variable.assign(keras.ops.where(keras.ops.equal(current, 0), size, current))


def _with_dimensions(specs: Any, dimensions: Iterator[int]) -> Any:
    """Returns `specs` with their unknown dimensions (besides the batch) taken from `dimensions`."""

    def filled(spec: cost.TensorSpec) -> cost.TensorSpec:
        rest = [(next(dimensions, 0) or None) if dim is None else dim for dim in spec.shape[1:]]
        return cost.TensorSpec((*spec.shape[:1], *rest), spec.dtype)

    return keras.tree.map_structure(filled, specs)
