"""`PlanCosts`: the predicted step time and activation memory of per-layer assignments."""

from __future__ import annotations

from collections.abc import Mapping

import keras

from .._core.dtypes import BFLOAT16, FLOAT8, FLOAT16, FLOAT32
from ..cost import CostTable, estimate
from ..layers import LayerInfo, describe_model
from ..plan import PrecisionPlan
from .space import plan_from_assignment


class PlanCosts:
    """Predicted step time and activation memory of plans, from a cost table or (missing) nothing."""

    def __init__(self, model: keras.Model, table: CostTable | None, batch_size: int) -> None:
        self.model = model
        self.table = table
        self.batch_size = batch_size
        self._cache: dict[tuple, tuple[float, float]] = {}
        self._layer_infos: dict[str, LayerInfo] | None = None

    @property
    def available(self) -> bool:
        return self.table is not None

    @property
    def relative_error(self) -> float | None:
        """The table's whole-step prediction error (`CostTable.relative_error`), `None` without one."""
        if self.table is None:
            return None
        return float(self.table.relative_error)

    def layer_seconds(self, path: str, dtype: str) -> float | None:
        if self.table is None or path not in self.table.layers:
            return None
        try:
            return float(self.table.seconds(path, dtype, self.batch_size))
        except Exception:  # noqa: BLE001 - a dtype the table did not time
            return None

    def step(self, dtypes: Mapping[str, str]) -> tuple[float, float]:
        """Returns `(predicted step seconds, activation bytes per sample)` for `{path: dtype}`."""
        key = tuple(sorted(dtypes.items()))
        if key in self._cache:
            return self._cache[key]
        if self.table is None:
            result = self._parameter_proxy(dtypes)
        else:
            # The whole plan, containers included: a container's own arithmetic (attention
            # scores, residual adds) costs time too, in the dtype its sub-layers give it.
            plan = plan_from_assignment(self.model, self._infos(), dtypes)
            step = estimate(self.model, plan, costs=self.table, batch_size=self.batch_size)
            result = (float(step.step_seconds), float(step.activation_bytes_per_sample))
        self._cache[key] = result
        return result

    def uniform_seconds(self, dtype: str) -> float:
        """Returns the predicted step seconds of `PrecisionPlan.uniform(model, dtype)`: Keras'
        policy."""
        key = ("uniform", dtype)
        if key not in self._cache:
            plan = PrecisionPlan.uniform(self.model, dtype)
            step = estimate(self.model, plan, costs=self.table, batch_size=self.batch_size)
            self._cache[key] = (float(step.step_seconds), float(step.activation_bytes_per_sample))
        return self._cache[key][0]

    def _infos(self) -> dict[str, LayerInfo]:
        if self._layer_infos is None:
            self._layer_infos = describe_model(self.model)
        return self._layer_infos

    def _parameter_proxy(self, dtypes: Mapping[str, str]) -> tuple[float, float]:
        infos = self._infos()
        factor = {FLOAT32: 1.0, BFLOAT16: 0.5, FLOAT16: 0.5, FLOAT8: 0.25}
        total = sum(
            (infos[path].parameters + 1) * factor[dtype]
            for path, dtype in dtypes.items()
            if path in infos
        )
        return total * 1e-9, total
