"""Where a plan's dtypes meet inside a composite layer, and whether the model runs under it."""

from __future__ import annotations

import dataclasses
import re

import keras

from ..errors import PlanError
from ..layers import is_graph_model, layer_paths


@dataclasses.dataclass(frozen=True)
class DtypeClash:
    """Two dtypes meeting inside a composite layer."""

    container: str
    container_dtype: str
    layer: str
    layer_dtype: str

    def describe(self) -> str:
        """Returns one line naming both layers and their dtypes."""
        where = repr(self.container) if self.container else "the model's own call"
        return (
            f"{self.layer!r} computes in {self.layer_dtype} inside {where}, "
            f"which computes in {self.container_dtype}"
        )


def composite_children(model: keras.Model) -> list[tuple[str, keras.layers.Layer, str, object]]:
    """Returns the sub-layers whose outputs reach their container's own `call` code."""
    paths = layer_paths(model)
    found = []
    for path, layer in paths.items():
        container_path = path.rsplit("/", 1)[0] if "/" in path else ""
        container = paths.get(container_path) if container_path else model
        if container is None or is_graph_model(container):
            continue
        found.append((path, layer, container_path, container))
    return found


def dtype_clashes(model: keras.Model) -> list[DtypeClash]:
    """Returns each sub-layer whose compute dtype differs from its composite container's."""
    clashes = []
    for path, layer, container_path, container in composite_children(model):
        layer_dtype, container_dtype = _compute_dtype(layer), _compute_dtype(container)
        if layer_dtype and container_dtype and layer_dtype != container_dtype:
            clashes.append(DtypeClash(container_path, container_dtype, path, layer_dtype))
    return clashes


def _compute_dtype(layer: object) -> str | None:
    dtype = getattr(layer, "compute_dtype", None)
    return keras.backend.standardize_dtype(dtype) if dtype else None


def check_plan_runs(model: keras.Model, inputs: object) -> None:
    """Runs `model` once on the first sample of `inputs`; a failure names the layers that clash."""
    first = keras.tree.map_structure(lambda value: value[:1], inputs)
    try:
        model(first, training=False)
    except Exception as error:  # noqa: BLE001 - any failure of the call is reported
        clashes = dtype_clashes(model)
        if clashes:
            advice = (
                "Layers whose dtype differs from their container's: "
                + "; ".join(clash.describe() for clash in clashes[:8])
                + ". Give them their container's dtype (plan.with_dtype(path, dtype))."
            )
        else:
            advice = (
                "No sub-layer's dtype differs from its container's, so the failing layer's "
                "own arithmetic mixes dtypes: keep it in float32 "
                "(plan.with_dtype(path, 'float32'))."
            )
        raise PlanError(
            f"model {model.name!r} cannot run under this plan: calling it on one sample "
            f"raised {type(error).__name__}: {_first_lines(error)} {advice}"
        ) from error


def _first_lines(error: Exception, count: int = 3) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines[:count])
