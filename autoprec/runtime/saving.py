"""`save_model` / `load_model`: a `.keras` file that carries its precision plan and loss scale."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import keras

from .._core.io import atomic_write
from ..errors import PlanError
from ..layers import is_fully_built
from ..plan import PrecisionPlan
from .apply import apply_plan
from .check import probe_inputs

#: Name of the plan among a `.keras` archive's assets (`model.save` writes it there, as
#: `ModelCheckpoint` and `BackupAndRestore` call it); earlier releases wrote it at the top.
PLAN_ENTRY = "autoprec_plan.json"


def attach_plan(model: keras.Model, plan: PrecisionPlan) -> None:
    """Records `plan` on `model` so that every save of it, autoprec's or Keras', keeps it."""
    object.__setattr__(model, "_autoprec_plan", plan)
    if getattr(model, "_autoprec_saves_whole", False):
        return
    own_save_assets = getattr(model, "save_assets", None)
    own_compile_config = model.get_compile_config

    def save_assets(dir_path):
        plan = attached_plan(model)
        if plan is not None:
            Path(dir_path, PLAN_ENTRY).write_text(plan.to_json(), encoding="utf-8")
        if own_save_assets is not None:
            own_save_assets(dir_path)

    def get_compile_config():  # the optimizer as it trains (a loss-scale wrap included)
        config = own_compile_config()
        optimizer = getattr(model, "optimizer", None)
        if config and optimizer is not None:
            config = {**config, "optimizer": keras.saving.serialize_keras_object(optimizer)}
        return config

    object.__setattr__(model, "_autoprec_saves_whole", True)
    object.__setattr__(model, "save_assets", save_assets)
    object.__setattr__(model, "get_compile_config", get_compile_config)


def attached_plan(model: keras.Model) -> PrecisionPlan | None:
    """Returns the plan last applied to `model` by autoprec, if any."""
    return getattr(model, "_autoprec_plan", None)


def save_model(
    model: keras.Model, path: str | os.PathLike, plan: PrecisionPlan | None = None
) -> Path:
    """Saves `model` as a `.keras` archive with its precision plan and loss-scale state inside.

    Args:
        model: the model to save.
        path: destination, ending in `.keras`. Written atomically.
        plan: the plan to store; defaults to the plan autoprec last applied to the
            model, else the model's current per-layer policies.

    Returns:
        The destination path.

    Example:

    ```python
    model.fit(x, y, callbacks=[autoprec.AutoPrecision(plan)])
    autoprec.save_model(model, "model.keras")
    restored = autoprec.load_model("model.keras")
    ```
    """
    destination = Path(path)
    if destination.suffix != ".keras":
        raise PlanError(f"save_model: {destination} must end in '.keras'.")
    # Keras' own save then writes the plan among the assets and the optimizer as it trains.
    attach_plan(model, plan or attached_plan(model) or PrecisionPlan.from_model(model))
    return atomic_write(destination, model.save, suffix=".keras")


def load_plan_from_archive(path: str | os.PathLike) -> PrecisionPlan | None:
    """Returns the plan stored in a `.keras` archive, or `None` where it holds none."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            entry = next((n for n in (PLAN_ENTRY, f"assets/{PLAN_ENTRY}") if n in names), None)
            if entry is None:
                return None
            text = archive.read(entry).decode("utf-8")
    except zipfile.BadZipFile:
        raise PlanError(f"{path}: not a .keras archive (bad zip file).") from None
    return PrecisionPlan.from_json(text, source=f"{path}:{entry}")


def load_model(
    path: str | os.PathLike, custom_objects: dict | None = None, compile: bool = True
) -> keras.Model:
    """Loads a `.keras` archive and re-applies the precision plan and loss scaling stored in it.

    Args:
        path: a file written by `autoprec.save_model` (plain `.keras` files load too).
        custom_objects: passed to `keras.saving.load_model`.
        compile: passed to `keras.saving.load_model`.

    Returns:
        The model, built (on a small probe batch where Keras left it unbuilt), with every
        layer's dtype as it was when saved and its optimizer as it trained (a loss-scale
        wrap and its scale included).
    """
    if not Path(path).exists():
        raise PlanError(f"load_model: {path}: no such file.")
    plan = load_plan_from_archive(path)
    model = keras.saving.load_model(path, custom_objects=custom_objects, compile=compile)
    if plan is not None:
        if not is_fully_built(model):
            probe_inputs(model)  # a model Keras cannot build from its build config builds at a call
        attach_plan(model, apply_plan(model, plan, strict=True).plan)
    return model
